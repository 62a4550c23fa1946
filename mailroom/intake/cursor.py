"""The mailbox cursor's state transitions: claim, renew, count, finish (failures: cursor_failures).

A poll owns a cursor through its ``lease_id``. Every write after the claim
matches on that id, so a worker whose lease was taken over (expired, or reset
by an operator) changes nothing: the write hits no row and ``LeaseLost`` is
raised (the per-mail fence lives with the mail's transaction in ``ingest``).
``retry_count`` and ``next_retry_at`` carry the backoff between polls.

A mail that kills its worker (OOM, a segfault, ``os._exit``) records no failure,
so ``retry_count`` never moves; ``attempt_uid`` and ``attempt_count`` count the
attempts that never came back. Nothing is counted at the claim or while a poll
waits in IDLE: only a poll that found new UIDs counts, just before it parses
(``count_attempt``). With no attempt left over, the poll counts one at the UID
it reads above (a group attempt: it says a death happened somewhere in the
poll, never which mail) and ingests in groups. With one left over, it reads and
commits mail by mail, counting at each UID before parsing it, so what stays
counted is the exact mail a worker died on; once ``max_retries`` attempts at
one UID did not come back, the next poll blocks the cursor at that UID without
reading the mail. A poll that ends in any recorded way (stored, failed,
cancelled, lease lost) gives its own attempt back (``give_back_attempt``, or
the failure's or finish's write), so only deaths stay counted. A death still
charges whatever attempt its process had in flight, but a group attempt only
makes the next poll go mail by mail: only deaths at one UID, mail by mail,
block a cursor.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, case, func, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.db.clock import DbClock, db_now
from mailroom.db.engine import transaction
from mailroom.db.models import MailboxCursor
from mailroom.errors import LeaseLost
from mailroom.intake import audit
from mailroom.intake.cursor_sql import (
    CLAIM_CURSOR,
    COUNT_ATTEMPT,
    CREATE_CURSOR,
    FINISH_BATCH,
    FIRST_UIDVALIDITY,
)
from mailroom.intake.lease import lease_write

logger = logging.getLogger(__name__)


@asynccontextmanager
async def lease_transaction(
    sessions: async_sessionmaker[AsyncSession],
) -> AsyncIterator[AsyncSession]:
    """``transaction`` for the lease's own bookkeeping, committed without waiting for the WAL flush.

    Asynchronous commit: each poll's claim, attempt count, renewals and finish do not wait
    for a disk flush (on a busy disk, waiting for each of them costs up to a tenth of a second a poll).
    Only a crash of Postgres itself can lose the last of them, never a worker's death, and
    a lost one is harmless: every mail's commit fences on the lease and flushes the WAL up to
    itself, so no mail is stored under a claim that is not durable; a lost finish leaves a
    lease that expires and a ``last_uid`` its mails' own commits advanced; a lost count is one
    attempt fewer. Failures, blocks and their audit events stay synchronous.
    """
    async with transaction(sessions) as session:
        await session.execute(text("SET LOCAL synchronous_commit = off"))
        yield session


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
    #: Attempts left over by earlier polls that never came back, and the UID of the last one.
    attempt_uid: int | None = None
    attempt_count: int = 0

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
    """Take the cursor's lease in one short transaction, creating the cursor if missing.

    One statement in one round trip (``CLAIM_CURSOR``): it ran as an ORM session of six,
    the claim of every poll, each waited for by the intake worker's one event loop.
    """
    lease_id = uuid.uuid4()
    params = {
        "mailbox": mailbox,
        "folder": folder,
        "lease_id": lease_id,
        "lease": timedelta(seconds=lease_s),
        "offset": await clock_offset(sessions, clock),
    }
    row = await lease_write(sessions, CLAIM_CURSOR, params)
    if row is None:  # the first poll: the insert is a round trip every poll would pay
        await lease_write(sessions, CREATE_CURSOR, {"mailbox": mailbox, "folder": folder})
        row = await lease_write(sessions, CLAIM_CURSOR, params)
    assert row is not None  # inserted above or already there
    # The claim cleared the poll-queued mark either way: the next pass may send again.
    skip, old_status, old_lease_id, *kept = row
    if skip is not None:
        return Skipped(skip)
    if old_status == "processing":
        logger.warning(
            "Mailbox %s/%r: taking over the expired lease %s", mailbox, folder, old_lease_id
        )
    cursor_id, uidvalidity, last_uid, retry_count, attempt_uid, attempt_count = kept
    return Claim(
        cursor_id=cursor_id,
        mailbox=mailbox,
        folder=folder,
        lease_id=lease_id,
        uidvalidity=uidvalidity,
        last_uid=last_uid,
        retry_count=retry_count,
        attempt_uid=attempt_uid,
        attempt_count=attempt_count,
    )


async def clock_offset(sessions: async_sessionmaker[AsyncSession], clock: DbClock) -> timedelta:
    """How far ``clock`` runs ahead of the database's ``now()``: none for ``db_now`` itself.

    The one-statement writes compute their times as ``now()`` plus this, so a test's clock
    (``tests/fixtures/imap.py``'s ``MutableClock``) moves them without a second code path.
    """
    if clock is db_now:
        return timedelta()
    async with transaction(sessions) as session:
        return await clock(session) - await db_now(session)


def owned_by(claim: Claim) -> ColumnElement[bool]:
    """The cursor's row, while ``claim``'s lease holds it."""
    return and_(MailboxCursor.id == claim.cursor_id, MailboxCursor.lease_id == claim.lease_id)


async def count_attempt(sessions: async_sessionmaker[AsyncSession], claim: Claim, uid: int) -> int:
    """Count an attempt at ``uid`` before it is parsed; the attempts there in a row, this one too.

    An attempt at another UID than the last one counted starts over at one.
    """
    row = await lease_write(sessions, COUNT_ATTEMPT, {**_owner(claim), "uid": uid})
    if row is None:
        raise LeaseLost(f"mailbox {claim.mailbox}: lease lost before UID {uid}")
    return int(row[0])


def _owner(claim: Claim) -> dict[str, Any]:
    """The parameters of ``owned_by`` for the raw statements."""
    return {"cursor_id": claim.cursor_id, "lease_id": claim.lease_id}


def attempts_without(uid: int) -> ColumnElement[int]:
    """``attempt_count`` less the attempt this poll counted at ``uid``."""
    return case(
        (
            MailboxCursor.attempt_uid == uid,
            func.greatest(MailboxCursor.attempt_count - 1, 0),
        ),
        else_=MailboxCursor.attempt_count,
    )


async def give_back_attempt(
    sessions: async_sessionmaker[AsyncSession], claim: Claim, uid: int
) -> None:
    """Uncount the attempt this poll counted at ``uid`` (its worker lives on); best effort.

    Not fenced on the lease, so a poll whose lease was lost gives its attempt back
    too: a decrement at the same UID keeps the count right whatever the next
    owner counted meanwhile. The lease stays.
    """
    try:
        async with transaction(sessions) as session:
            await session.execute(
                update(MailboxCursor)
                .where(MailboxCursor.id == claim.cursor_id)
                .values(attempt_count=attempts_without(uid))
            )
    except Exception:
        logger.warning("Mailbox %s: could not give the attempt back", claim.mailbox, exc_info=True)


async def renew_lease(
    sessions: async_sessionmaker[AsyncSession],
    claim: Claim,
    *,
    lease_s: float,
    clock: DbClock = db_now,
) -> bool:
    """Push ``lease_until`` forward; False when the lease is no longer ours."""
    async with lease_transaction(sessions) as session:
        now = await clock(session)
        renewed = await session.scalar(
            update(MailboxCursor)
            .where(owned_by(claim))
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
    if claim.uidvalidity is None:  # the folder's first poll: a plain write, no audit event
        params = {**_owner(claim), "uidvalidity": uidvalidity}
        if await lease_write(sessions, FIRST_UIDVALIDITY, params) is None:
            raise LeaseLost(f"mailbox {claim.mailbox}: lease lost while storing UIDVALIDITY")
        return claim.last_uid
    async with transaction(sessions) as session:
        # Attempts left over at the old numbering say nothing about the new one's UIDs.
        stored = await session.scalar(
            update(MailboxCursor)
            .where(owned_by(claim))
            .values(uidvalidity=uidvalidity, updated_at=func.now(), last_uid=0, attempt_count=0)
            .returning(MailboxCursor.id)
        )
        if stored is None:
            raise LeaseLost(f"mailbox {claim.mailbox}: lease lost while storing UIDVALIDITY")
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
    return 0


async def finish_batch(
    sessions: async_sessionmaker[AsyncSession], claim: Claim, *, highest_uid: int
) -> bool:
    """Advance ``last_uid`` to the highest UID scanned, release the lease, reset retry state.

    True when a poll sent meanwhile found the cursor leased: poll again now.
    """
    done = await lease_write(sessions, FINISH_BATCH, {**_owner(claim), "highest_uid": highest_uid})
    if done is None:
        raise LeaseLost(f"mailbox {claim.mailbox}: lease lost before the batch finished")
    return bool(done[1])
