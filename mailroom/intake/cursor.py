"""The mailbox cursor's state transitions: claim, renew, fail, block, finish.

A poll owns a cursor through its ``lease_id``. Every write after the claim
matches on that id, so a worker whose lease was taken over (expired, or reset
by an operator) changes nothing: the write hits no row and ``LeaseLost`` is
raised (the per-mail fence lives with the mail's transaction in ``ingest``).
``retry_count`` and ``next_retry_at`` carry the backoff between polls.

A mail that kills its worker (OOM, a segfault, ``os._exit``) records no failure,
so ``retry_count`` never moves. Each claim therefore counts an attempt at the
cursor's ``last_uid`` (``attempt_uid``, ``attempt_count``) before the batch; a
batch that ends in any recorded way clears it, and progress past the UID starts
it over. A claim past ``max_retries`` attempts at the same UID makes the batch
block the cursor at the first UID above it without reading that mail.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.backoff import backoff
from mailroom.clock import DbClock, db_now
from mailroom.db import transaction
from mailroom.errors import LeaseLost, describe_error
from mailroom.intake import audit
from mailroom.models import InboundMail, MailboxCursor

logger = logging.getLogger(__name__)


def backoff_s(retry_count: int, *, max_backoff_s: float) -> float:
    """Wait after the ``retry_count``-th failure in a row: ``min(max, 2**retry_count)`` seconds."""
    return float(backoff(retry_count, base=1, cap=max_backoff_s))


@dataclass(frozen=True)
class Claim:
    """A cursor this poll holds the lease of, as it stood when claimed."""

    cursor_id: int
    mailbox: str
    folder: str
    lease_id: uuid.UUID
    uidvalidity: int | None
    last_uid: int
    retry_count: int
    #: Claims at ``last_uid`` in a row that never came back, this one included.
    attempts: int = 1

    @property
    def target(self) -> str:
        return audit.cursor_target(self.mailbox, self.folder)


@dataclass(frozen=True)
class Skipped:
    """Why a poll left the cursor alone: ``blocked``, ``leased`` or ``backoff``."""

    reason: str


async def claim_cursor(
    sessions: async_sessionmaker[AsyncSession],
    *,
    mailbox: str,
    folder: str,
    lease_s: float,
    clock: DbClock = db_now,
) -> Claim | Skipped:
    """Take the cursor's lease in one short transaction, creating the cursor if missing."""
    async with transaction(sessions) as session:
        now = await clock(session)
        # Two first polls may race to create the row: the loser's insert does nothing.
        await session.execute(
            insert(MailboxCursor)
            .values(mailbox=mailbox, folder=folder)
            .on_conflict_do_nothing(index_elements=["mailbox", "folder"])
        )
        cursor = await session.scalar(
            select(MailboxCursor)
            .where(MailboxCursor.mailbox == mailbox, MailboxCursor.folder == folder)
            .with_for_update()
        )
        assert cursor is not None  # inserted above or already there
        if cursor.status == "blocked":
            return Skipped("blocked")
        if cursor.lease_id is not None and cursor.lease_until and cursor.lease_until > now:
            return Skipped("leased")
        if cursor.next_retry_at is not None and cursor.next_retry_at > now:
            return Skipped("backoff")
        if cursor.status == "processing":
            logger.warning(
                "Mailbox %s/%r: taking over the expired lease %s",
                mailbox,
                folder,
                cursor.lease_id,
            )
        if cursor.attempt_uid == cursor.last_uid:
            cursor.attempt_count += 1
        else:
            cursor.attempt_uid, cursor.attempt_count = cursor.last_uid, 1
        lease_id = uuid.uuid4()
        cursor.status = "processing"
        cursor.lease_id = lease_id
        cursor.lease_until = now + timedelta(seconds=lease_s)
        cursor.updated_at = now
        return Claim(
            cursor_id=cursor.id,
            mailbox=mailbox,
            folder=folder,
            lease_id=lease_id,
            uidvalidity=cursor.uidvalidity,
            last_uid=cursor.last_uid,
            retry_count=cursor.retry_count,
            attempts=cursor.attempt_count,
        )


def _owned(claim: Claim) -> ColumnElement[bool]:
    return and_(MailboxCursor.id == claim.cursor_id, MailboxCursor.lease_id == claim.lease_id)


async def forget_attempt(sessions: async_sessionmaker[AsyncSession], claim: Claim) -> None:
    """Uncount this claim's attempt (its worker lives on); best effort, the lease stays."""
    try:
        async with transaction(sessions) as session:
            await session.execute(
                update(MailboxCursor)
                .where(_owned(claim))
                .values(attempt_count=func.greatest(MailboxCursor.attempt_count - 1, 0))
            )
    except Exception:
        logger.warning(
            "Mailbox %s: could not clear the attempt count", claim.mailbox, exc_info=True
        )


async def renew_lease(
    sessions: async_sessionmaker[AsyncSession],
    claim: Claim,
    *,
    lease_s: float,
    clock: DbClock = db_now,
) -> bool:
    """Push ``lease_until`` forward; False when the lease is no longer ours."""
    async with transaction(sessions) as session:
        now = await clock(session)
        renewed = await session.scalar(
            update(MailboxCursor)
            .where(_owned(claim))
            .values(lease_until=now + timedelta(seconds=lease_s))
            .returning(MailboxCursor.id)
        )
    return renewed is not None


async def adopt_uidvalidity(
    sessions: async_sessionmaker[AsyncSession], claim: Claim, uidvalidity: int
) -> int:
    """Store the folder's UIDVALIDITY; the UID to read above (0 when it changed)."""
    if claim.uidvalidity == uidvalidity:
        return claim.last_uid
    changed = claim.uidvalidity is not None
    async with transaction(sessions) as session:
        values: dict[str, object] = {"uidvalidity": uidvalidity, "updated_at": func.now()}
        if changed:
            values["last_uid"] = 0
        stored = await session.scalar(
            update(MailboxCursor).where(_owned(claim)).values(**values).returning(MailboxCursor.id)
        )
        if stored is None:
            raise LeaseLost(f"mailbox {claim.mailbox}: lease lost while storing UIDVALIDITY")
        if changed:
            logger.warning(
                "Mailbox %s/%r: UIDVALIDITY changed from %s to %s; reading from UID 0, "
                "known mails are skipped by Message-ID and content hash",
                claim.mailbox,
                claim.folder,
                claim.uidvalidity,
                uidvalidity,
            )
            await audit.record_audit(
                session,
                audit.UIDVALIDITY_CHANGED,
                target=claim.target,
                detail={
                    "old_uidvalidity": claim.uidvalidity,
                    "new_uidvalidity": uidvalidity,
                    "old_last_uid": claim.last_uid,
                },
            )
    return 0 if changed else claim.last_uid


@dataclass(frozen=True)
class Failure:
    """What a recorded failure did to the cursor."""

    status: str
    retry_count: int
    next_retry_at: datetime | None


async def _count_failure(session: AsyncSession, claim: Claim, what: str) -> int:
    """One more failure on the cursor we lease; LeaseLost when the lease is gone.

    The attempt came back (it is recording its end), so its claim stops counting:
    ``retry_count`` bounds the failures that are recorded.
    """
    count = await session.scalar(
        update(MailboxCursor)
        .where(_owned(claim))
        .values(retry_count=MailboxCursor.retry_count + 1, attempt_count=0)
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

    ``exhausted``: the claims at this UID ran out (workers died on it): block at once.
    """
    text = describe_error(error)
    async with transaction(sessions) as session:
        now = await clock(session)
        count = await _count_failure(session, claim, f"UID {uid}")
        blocked = exhausted or count >= max_retries
        retry_at = (
            None
            if blocked
            else now + timedelta(seconds=backoff_s(count, max_backoff_s=max_backoff_s))
        )
        await session.execute(
            update(MailboxCursor)
            .where(MailboxCursor.id == claim.cursor_id)
            .values(
                status="blocked" if blocked else "failed",
                next_retry_at=retry_at,
                last_error=text,
                blocked_uid=uid if blocked else None,
                blocked_message_id=message_id if blocked else None,
                lease_id=None,
                lease_until=None,
                updated_at=now,
            )
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
    clock: DbClock = db_now,
) -> Failure:
    """Back the cursor off after a batch that could not run (IMAP down, login refused)."""
    async with transaction(sessions) as session:
        now = await clock(session)
        count = await _count_failure(session, claim, "a failure")
        retry_at = now + timedelta(seconds=backoff_s(count, max_backoff_s=max_backoff_s))
        await session.execute(
            update(MailboxCursor)
            .where(MailboxCursor.id == claim.cursor_id)
            .values(
                status="failed",
                next_retry_at=retry_at,
                last_error=describe_error(error),
                lease_id=None,
                lease_until=None,
                updated_at=now,
            )
        )
    return Failure("failed", count, retry_at)


async def finish_batch(
    sessions: async_sessionmaker[AsyncSession], claim: Claim, *, highest_uid: int
) -> None:
    """Advance ``last_uid`` to the highest UID scanned, release the lease, reset retry state."""
    async with transaction(sessions) as session:
        done = await session.scalar(
            update(MailboxCursor)
            .where(_owned(claim))
            .values(
                last_uid=func.greatest(MailboxCursor.last_uid, highest_uid),
                status="idle",
                lease_id=None,
                lease_until=None,
                retry_count=0,
                attempt_count=0,
                next_retry_at=None,
                last_error=None,
                updated_at=func.now(),
            )
            .returning(MailboxCursor.id)
        )
    if done is None:
        raise LeaseLost(f"mailbox {claim.mailbox}: lease lost before the batch finished")
