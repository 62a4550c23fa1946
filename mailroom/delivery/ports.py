"""What the delivery pipeline needs from the outside: envelopes and an outbound sender."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Envelope:
    """One chunk of one channel message, as handed to a channel."""

    message_id: int
    channel: str
    account: str
    recipient: str
    subject: str | None
    #: This chunk's text.
    body: str
    #: 1-based chunk number.
    chunk: int
    chunks: int

    @property
    def idempotency_key(self) -> str:
        """Stable across retries and processes: message id plus chunk number."""
        return f"{self.message_id}:{self.chunk}"


#: Sends one envelope and returns the provider's id for it, if it gave one; raises
#: ``RateLimited``, a ``RetryableError`` or a ``PermanentError``.
Send = Callable[[Envelope], Awaitable[str | None]]


class Outbound(Protocol):
    """Channel plugins behind their middleware chains, one chain per (channel, account)."""

    def sender(self, channel: str, account: str) -> Send:
        """The cached chain for (channel, account); ``PermanentError`` when unknown."""
        ...

    def is_idempotent(self, channel: str) -> bool:
        """Whether a resend of a chunk is deduplicated by the receiver."""
        ...
