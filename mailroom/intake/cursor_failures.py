"""The mailbox cursor's failures: back off, or block, after a mail or a batch that failed.

Each failure in a row counts in ``retry_count`` and doubles the wait before the next
poll (``backoff_s``); past the limit the cursor is blocked until an operator resets it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, func, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import InstrumentedAttribute

from mailroom.backoff import backoff
from mailroom.db.clock import DbClock, db_now
from mailroom.db.engine import transaction
from mailroom.db.models import InboundMail, MailboxCursor
from mailroom.errors import LeaseLost, describe_error
from mailroom.intake import audit
from mailroom.intake.cursor import Claim, attempts_without, owned_by


def backoff_s(retry_count: int, *, max_backoff_s: float) -> float:
    """Wait after the ``retry_count``-th failure in a row: ``min(max, 2**retry_count)`` seconds."""
    return float(backoff(retry_count, base=1, cap=max_backoff_s))


@dataclass(frozen=True)
class Failure:
    """What a recorded failure did to the cursor."""

    status: str
    retry_count: int
    next_retry_at: datetime | None


async def _count_failure(
    session: AsyncSession,
    claim: Claim,
    what: str,
    attempts: ColumnElement[int] | InstrumentedAttribute[int] | int,
) -> int:
    """One more failure on the cursor we lease; LeaseLost when the lease is gone.

    The attempt came back (it is recording its end), so it stops counting
    (``attempts``): ``retry_count`` bounds the failures that are recorded.
    """
    count = await session.scalar(
        update(MailboxCursor)
        .where(owned_by(claim))
        .values(retry_count=MailboxCursor.retry_count + 1, attempt_count=attempts)
        .returning(MailboxCursor.retry_count)
    )
    if count is None:
        raise LeaseLost(f"mailbox {claim.mailbox}: lease lost while recording {what}")
    return int(count)


async def record_mail_failure(
    sessions: async_sessionmaker[AsyncSession],
    claim: Claim,
    *,
    uidvalidity: int,
    uid: int,
    message_id: str | None,
    error: BaseException,
    max_retries: int,
    max_backoff_s: float,
    clock: DbClock = db_now,
    exhausted: bool = False,
) -> Failure:
    """Back off (or block) the cursor at ``uid``, record the attempt on the mail, release the lease.

    ``exhausted``: the attempts at this UID ran out (workers died on it): block at once.
    The mail's failure is recorded at its UID, so the attempts counted there are cleared.
    """
    text = describe_error(error)
    async with transaction(sessions) as session:
        now = await clock(session)
        count = await _count_failure(session, claim, f"UID {uid}", 0)
        blocked = exhausted or count >= max_retries
        retry_at = await _back_off(
            session,
            claim,
            now=now,
            count=count,
            blocked=blocked,
            text=text,
            max_backoff_s=max_backoff_s,
            blocked_uid=uid if blocked else None,
            blocked_message_id=message_id if blocked else None,
        )
        stmt = insert(InboundMail).values(
            cursor_id=claim.cursor_id,
            uidvalidity=uidvalidity,
            uid=uid,
            message_id=message_id,
            status="failed",
            retry_count=1,
            last_error=text,
            last_attempt_at=now,
            next_retry_at=retry_at,
        )
        await session.execute(
            stmt.on_conflict_do_update(
                index_elements=["cursor_id", "uidvalidity", "uid"],
                set_={
                    "retry_count": InboundMail.retry_count + 1,
                    "message_id": func.coalesce(stmt.excluded.message_id, InboundMail.message_id),
                    "last_error": text,
                    "last_attempt_at": now,
                    "next_retry_at": retry_at,
                },
                where=InboundMail.status == "failed",
            )
        )
        if blocked:
            await audit.record_audit(
                session,
                audit.CURSOR_BLOCKED,
                target=claim.target,
                detail={
                    "uid": uid,
                    "uidvalidity": uidvalidity,
                    "message_id": message_id,
                    "retry_count": count,
                    "error": text,
                },
            )
    return Failure("blocked" if blocked else "failed", count, retry_at)


async def record_batch_failure(
    sessions: async_sessionmaker[AsyncSession],
    claim: Claim,
    *,
    error: BaseException,
    max_backoff_s: float,
    counted: int | None = None,
    clock: DbClock = db_now,
    block_after: int | None = None,
    reason: str | None = None,
) -> Failure:
    """Back the cursor off after a batch that could not run (IMAP down, login refused).

    ``counted``: the UID this poll counted its attempt at, given back here; attempts
    left over by dead workers stay (the batch never got to their mail).
    ``block_after``: block the cursor once this many failures in a row were recorded
    (a cause that needs a person, such as a refused login), stored as ``reason``
    (``blocked_reason``); None backs off forever.
    """
    text = describe_error(error)
    async with transaction(sessions) as session:
        now = await clock(session)
        attempts = MailboxCursor.attempt_count if counted is None else attempts_without(counted)
        count = await _count_failure(session, claim, "a failure", attempts)
        blocked = block_after is not None and count >= block_after
        retry_at = await _back_off(
            session,
            claim,
            now=now,
            count=count,
            blocked=blocked,
            text=text,
            max_backoff_s=max_backoff_s,
            blocked_reason=reason if blocked else None,
        )
        if blocked:
            await audit.record_audit(
                session,
                audit.CURSOR_BLOCKED,
                target=claim.target,
                detail={"uid": None, "reason": reason, "retry_count": count, "error": text},
            )
    return Failure("blocked" if blocked else "failed", count, retry_at)


async def _back_off(
    session: AsyncSession,
    claim: Claim,
    *,
    now: datetime,
    count: int,
    blocked: bool,
    text: str,
    max_backoff_s: float,
    **blocked_at: object,
) -> datetime | None:
    """Set the cursor ``failed`` until its next retry (or ``blocked``) and release its lease.

    ``blocked_at``: what the block names (the UID and Message-ID, or the reason). Returns
    the next retry's time, None when blocked.
    """
    retry_at = (
        None if blocked else now + timedelta(seconds=backoff_s(count, max_backoff_s=max_backoff_s))
    )
    await session.execute(
        update(MailboxCursor)
        .where(MailboxCursor.id == claim.cursor_id)
        .values(
            status="blocked" if blocked else "failed",
            next_retry_at=retry_at,
            last_error=text,
            lease_id=None,
            lease_until=None,
            updated_at=now,
            **blocked_at,
        )
    )
    return retry_at
