"""Long bodies split into chunks, and the per-chunk record kept in ``channel_message.chunks``.

The record (jsonb) is ``{"size": 4000, "total": 5, "status": {"1": "sent", "3": "failed"}}``,
with ``"ids": {"1": "<provider's id>"}`` for the chunks whose provider named them.
The chunk size is stored with it, so a retry splits the body exactly as the first
attempt did even if the setting changed in between, and resumes at the first
chunk not marked ``sent``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SENT = "sent"
FAILED = "failed"


def split_body(body: str, size: int) -> list[str]:
    """Split ``body`` into chunks of at most ``size`` characters.

    Cuts at the last newline, else the last space, in the second half of a chunk
    so words stay whole when they can; an empty body is one empty chunk.
    """
    if size <= 0:
        raise ValueError("chunk size must be positive")
    chunks: list[str] = []
    rest = body
    while len(rest) > size:
        window = rest[:size]
        cut = window.rfind("\n", size // 2)
        if cut < 0:
            cut = window.rfind(" ", size // 2)
        cut = cut + 1 if cut >= 0 else size
        chunks.append(rest[:cut])
        rest = rest[cut:]
    chunks.append(rest)
    return chunks


@dataclass
class ChunkPlan:
    """The chunks of one message and which of them went out."""

    size: int
    texts: list[str]
    status: dict[str, str] = field(default_factory=dict)
    #: The provider's id of each sent chunk that got one (a webhook's answer, a Message-ID).
    ids: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, body: str, record: dict[str, Any] | None, *, default_size: int) -> ChunkPlan:
        record = record if isinstance(record, dict) else {}
        size = record.get("size")
        size = size if isinstance(size, int) and size > 0 else default_size
        status = record.get("status")
        status = {str(k): str(v) for k, v in status.items()} if isinstance(status, dict) else {}
        ids = record.get("ids")
        ids = {str(k): str(v) for k, v in ids.items()} if isinstance(ids, dict) else {}
        return cls(size=size, texts=split_body(body, size), status=status, ids=ids)

    @property
    def total(self) -> int:
        return len(self.texts)

    def is_sent(self, number: int) -> bool:
        return self.status.get(str(number)) == SENT

    def unsent(self) -> list[int]:
        """1-based numbers of the chunks still to send, in order."""
        return [n for n in range(1, self.total + 1) if not self.is_sent(n)]

    @property
    def sent_count(self) -> int:
        return sum(1 for n in range(1, self.total + 1) if self.is_sent(n))

    def mark(self, number: int, state: str, provider_id: str | None = None) -> None:
        self.status[str(number)] = state
        if provider_id:
            self.ids[str(number)] = provider_id

    def record(self) -> dict[str, Any]:
        record = {"size": self.size, "total": self.total, "status": dict(self.status)}
        return record | {"ids": dict(self.ids)} if self.ids else record
