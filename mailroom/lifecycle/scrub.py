"""Erasure reaches the audit trail: who did what and when stays, the mail's content goes.

Audit rows about an erased mail's records (its files, jobs, documents, notifications, the
mail itself, and a cursor's rows about its UID) may quote its content: a review's field
values (``review.corrected``: from and to), a replay's reason, the Message-ID and error of a
mail that blocked its mailbox. Erasure rewrites their ``detail`` to the keys that only name
records, count or state (``KEPT``); a correction keeps the names of the fields it changed.
The row's actor, action, target and time are untouched, and ``scrubbed`` marks the row.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from mailroom.db.models import AuditEvent, MailboxCursor

#: Detail keys that never carry a mail's content: ids, counts, attempts, statuses.
KEPT = frozenset(
    {
        "attempt",
        "document_id",
        "file_id",
        "job_id",
        "new_job_id",
        "previous_error_code",
        "previous_job_id",
        "previous_status",
        "purged_before",
        "retry_count",
        "uid",
        "uidvalidity",
        "blocked_uid",
        "old_last_uid",
        "new_last_uid",
    }
)
#: ``detail.scrubbed`` of a row erasure rewrote.
SCRUBBED = "content removed by erasure"
#: Cursor events that name a mail by its UID (and may quote its Message-ID and error).
_CURSOR_ACTIONS = ("intake.cursor_blocked", "intake.unblocked")


@dataclass(frozen=True)
class ErasedRecords:
    """The rows an erasure removed, as audit targets and a cursor's UID."""

    mail_id: int
    file_ids: list[int]
    job_ids: list[str]
    document_ids: list[int]
    channel_message_ids: list[int]
    #: ``mailbox:NAME/FOLDER`` of the mail's cursor, its UIDVALIDITY and UID.
    cursor_target: str | None
    uidvalidity: int
    uid: int

    def targets(self) -> list[str]:
        return [
            f"mail:{self.mail_id}",
            *(f"stored_file:{i}" for i in self.file_ids),
            *(f"recognition_job:{i}" for i in self.job_ids),
            *(f"document:{i}" for i in self.document_ids),
            *(f"channel_message:{i}" for i in self.channel_message_ids),
        ]


def scrubbed_detail(detail: dict[str, Any]) -> dict[str, Any]:
    """``detail`` with only the keys of ``KEPT``; a correction keeps its fields' names."""
    kept = {key: value for key, value in detail.items() if key in KEPT}
    if isinstance(changes := detail.get("changes"), dict):
        kept["changed_fields"] = sorted(changes)
    kept["scrubbed"] = SCRUBBED
    return kept


def _about_uid(event: AuditEvent, records: ErasedRecords) -> bool:
    detail = event.detail or {}
    if detail.get("uid") == records.uid:
        return detail.get("uidvalidity") in (None, records.uidvalidity)
    return detail.get("blocked_uid") == records.uid


async def scrub_cursor(session: AsyncSession, cursor_id: int, uid: int) -> None:
    """A cursor blocked at the erased mail forgets its Message-ID and error (it stays blocked)."""
    await session.execute(
        update(MailboxCursor)
        .where(MailboxCursor.id == cursor_id, MailboxCursor.blocked_uid == uid)
        .values(blocked_message_id=None, last_error=SCRUBBED)
    )


async def scrub_audit(session: AsyncSession, records: ErasedRecords) -> int:
    """Rewrite the audit rows about the erased records (in the erasure's transaction).

    Returns how many rows were rewritten; a row scrubbed before is left as it is.
    """
    about_records = AuditEvent.target.in_(records.targets())
    query = select(AuditEvent).where(about_records)
    if records.cursor_target is not None:
        about_cursor = (AuditEvent.target == records.cursor_target) & AuditEvent.action.in_(
            _CURSOR_ACTIONS
        )
        query = select(AuditEvent).where(or_(about_records, about_cursor))
    events: Iterable[AuditEvent] = await session.scalars(query.with_for_update())
    count = 0
    for event in events:
        if event.target == records.cursor_target and not _about_uid(event, records):
            continue
        if (event.detail or {}).get("scrubbed") == SCRUBBED:
            continue
        event.detail = scrubbed_detail(event.detail or {})
        count += 1
    return count
