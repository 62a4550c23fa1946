"""Operator use cases on mailbox cursors: status, unblock, reset (each change audit-logged)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.db.audit import OPERATOR, operator_id
from mailroom.db.engine import transaction
from mailroom.db.models import MailboxCursor
from mailroom.errors import CursorBusy, CursorNotFound
from mailroom.intake import audit


@dataclass(frozen=True)
class CursorView:
    mailbox: str
    folder: str
    status: str
    uidvalidity: int | None
    last_uid: int
    retry_count: int
    next_retry_at: datetime | None
    lease_until: datetime | None
    blocked_uid: int | None
    blocked_message_id: str | None
    blocked_reason: str | None
    last_error: str | None
    updated_at: datetime


async def list_cursors(sessions: async_sessionmaker[AsyncSession]) -> list[CursorView]:
    async with sessions() as session:
        rows = await session.scalars(
            select(MailboxCursor).order_by(MailboxCursor.mailbox, MailboxCursor.folder)
        )
        return [
            CursorView(
                mailbox=c.mailbox,
                folder=c.folder,
                status=c.status,
                uidvalidity=c.uidvalidity,
                last_uid=c.last_uid,
                retry_count=c.retry_count,
                next_retry_at=c.next_retry_at,
                lease_until=c.lease_until,
                blocked_uid=c.blocked_uid,
                blocked_message_id=c.blocked_message_id,
                blocked_reason=c.blocked_reason,
                last_error=c.last_error,
                updated_at=c.updated_at,
            )
            for c in rows
        ]


async def _locked_cursor(session: AsyncSession, mailbox: str, folder: str | None) -> MailboxCursor:
    query = select(MailboxCursor).where(MailboxCursor.mailbox == mailbox)
    if folder is not None:
        query = query.where(MailboxCursor.folder == folder)
    rows = list(await session.scalars(query.with_for_update()))
    if not rows:
        where = f"{mailbox!r}" + (f" folder {folder!r}" if folder else "")
        raise CursorNotFound(f"no cursor for mailbox {where}")
    if len(rows) > 1:
        folders = ", ".join(repr(r.folder) for r in rows)
        raise CursorNotFound(f"mailbox {mailbox!r} has several folders ({folders}): pick one")
    return rows[0]


def _clear_failure(cursor: MailboxCursor, now: datetime) -> None:
    cursor.status = "idle"
    cursor.retry_count = 0
    cursor.attempt_count = 0  # else the next poll would block it again at the same UID
    cursor.next_retry_at = None
    cursor.blocked_uid = None
    cursor.blocked_message_id = None
    cursor.blocked_reason = None
    cursor.lease_id = None
    cursor.lease_until = None
    cursor.updated_at = now


async def unblock_mailbox(
    sessions: async_sessionmaker[AsyncSession],
    mailbox: str,
    *,
    folder: str | None = None,
    operator: str | None = None,
) -> CursorView:
    """Let a blocked (or backed-off) cursor retry at once, from where it stopped."""
    async with transaction(sessions) as session:
        cursor, now = await _idle_cursor(session, mailbox, folder)
        detail = {
            "previous_status": cursor.status,
            "blocked_uid": cursor.blocked_uid,
            "blocked_message_id": cursor.blocked_message_id,
            "blocked_reason": cursor.blocked_reason,
            "retry_count": cursor.retry_count,
            "last_error": cursor.last_error,
        }
        _clear_failure(cursor, now)
        await _audit_operator(session, cursor, audit.UNBLOCKED, detail, operator)
    return (await _views(sessions, cursor.mailbox, cursor.folder))[0]


async def reset_mailbox(
    sessions: async_sessionmaker[AsyncSession],
    mailbox: str,
    *,
    uid: int,
    folder: str | None = None,
    operator: str | None = None,
) -> CursorView:
    """Set ``last_uid`` (the next poll reads above it) and clear any failure or block.

    Moving back re-reads mails; those already stored are skipped by dedupe, erased ones by
    their tombstones (``intake.tombstones``).
    Moving forward skips mails for good: that is the operator's decision.
    """
    if uid < 0:
        raise CursorNotFound("the UID must be 0 or more")
    async with transaction(sessions) as session:
        cursor, now = await _idle_cursor(session, mailbox, folder)
        detail = {
            "previous_status": cursor.status,
            "old_last_uid": cursor.last_uid,
            "new_last_uid": uid,
            "uidvalidity": cursor.uidvalidity,
            "blocked_uid": cursor.blocked_uid,
        }
        cursor.last_uid = uid
        cursor.last_error = None
        _clear_failure(cursor, now)
        await _audit_operator(session, cursor, audit.RESET, detail, operator)
    return (await _views(sessions, cursor.mailbox, cursor.folder))[0]


async def _idle_cursor(
    session: AsyncSession, mailbox: str, folder: str | None
) -> tuple[MailboxCursor, datetime]:
    """The cursor, locked, and the database's now; refused while a poll holds its lease."""
    cursor = await _locked_cursor(session, mailbox, folder)
    now = await _db_now(session)
    if cursor.status == "processing" and cursor.lease_until and cursor.lease_until > now:
        raise CursorBusy(f"mailbox {mailbox!r} is being polled right now")
    return cursor, now


async def _audit_operator(
    session: AsyncSession,
    cursor: MailboxCursor,
    action: str,
    detail: dict[str, Any],
    operator: str | None,
) -> None:
    await audit.record_audit(
        session,
        action,
        target=audit.cursor_target(cursor.mailbox, cursor.folder),
        detail=detail,
        actor_type=OPERATOR,
        actor_id=operator or operator_id(),
    )


async def _db_now(session: AsyncSession) -> datetime:
    now: datetime | None = await session.scalar(select(func.now()))
    assert now is not None
    return now


async def _views(
    sessions: async_sessionmaker[AsyncSession], mailbox: str, folder: str
) -> list[CursorView]:
    return [v for v in await list_cursors(sessions) if (v.mailbox, v.folder) == (mailbox, folder)]
