"""The poll-queued mark: at most one queued poll per mailbox, and none a claim would skip.

The scheduler's pass (``actors.intake.poll_mailboxes``) sends a poll only to the
mailboxes ``mark_polls_queued`` marks; ``claim_cursor`` clears the mark. So
however long the intake queue gets, it holds one poll of each mailbox, in the
order they were sent, and each mailbox gets its turn (ARCHITECTURE.md, Intake).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, func, or_, select, true, tuple_, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import InstrumentedAttribute

from mailroom.db.clock import DbClock, db_now
from mailroom.db.models import MailboxCursor
from mailroom.intake.cursor import lease_transaction


async def mark_polls_queued(
    sessions: async_sessionmaker[AsyncSession],
    mailboxes: Sequence[tuple[str, str]],
    *,
    lost_after_s: float,
    clock: DbClock = db_now,
    leased_too: bool = False,
    watched_poll_interval_s: float | None = None,
    watched_most: int | None = None,
) -> set[str]:
    """Mark the (mailbox, folder) pairs a poll may be sent to now; the mailboxes marked.

    A mailbox is left out while a poll of it is queued (marked, not yet claimed, for less
    than ``lost_after_s``: an older mark is taken for a lost message), running (leased),
    backing off or blocked: its poll would only wait in the queue or skip. The claim
    clears the mark. Creates missing cursors, as the claim does.

    ``leased_too``: mark a leased cursor as well (the watcher's news): the running poll may
    have searched before the new mail came, and the sent poll's claim, finding the lease,
    tells it to poll again (``poll_again``).
    ``watched_poll_interval_s`` (the scheduler's pass): leave out a folder a watcher watches
    live (``watched_until`` ahead) whose last poll is more recent than this, and mark at
    most ``watched_most`` of those due, the longest unpolled first: the guard polls of a
    thousand folders watched since the same moment would otherwise come due in one pass
    and queue every announced mail's poll behind them.
    """
    if not mailboxes:
        return set()
    # Its commit need not wait for a disk flush: a mark lost with Postgres only lets a pass
    # send a second poll, which the claim skips or serves (``lease_transaction``).
    async with lease_transaction(sessions) as session:
        now = await clock(session)
        await session.execute(
            insert(MailboxCursor)
            .values([{"mailbox": mailbox, "folder": folder} for mailbox, folder in mailboxes])
            .on_conflict_do_nothing(index_elements=["mailbox", "folder"])
        )
        # A pass leaves rows a claim (or another pass) has locked right now to it, not waiting.
        # The watcher's news waits for the lock instead: it may be a poll's finish or lease
        # renewal, whose poll searched before the new mail came; skipped, that mail would
        # wait for the next pass (the locks are one short transaction each).
        due = select(MailboxCursor.id).where(
            tuple_(MailboxCursor.mailbox, MailboxCursor.folder).in_(list(mailboxes)),
            MailboxCursor.status != "blocked",
            _not_after(MailboxCursor.poll_queued_at, now - timedelta(seconds=lost_after_s)),
            true() if leased_too else _not_after(MailboxCursor.lease_until, now),
            _not_after(MailboxCursor.next_retry_at, now),
        )
        if watched_poll_interval_s is None:
            batches = [due.order_by(MailboxCursor.id)]
        else:
            live = MailboxCursor.watched_until > now
            last_poll_before = now - timedelta(seconds=watched_poll_interval_s)
            batches = [
                due.where(~live | MailboxCursor.watched_until.is_(None)).order_by(MailboxCursor.id),
                due.where(live, MailboxCursor.updated_at <= last_poll_before)
                .order_by(MailboxCursor.updated_at)
                .limit(watched_most),
            ]
        marked: set[str] = set()
        for batch in batches:
            marked |= set(
                await session.scalars(
                    update(MailboxCursor)
                    .where(
                        MailboxCursor.id.in_(
                            batch.with_for_update(skip_locked=not leased_too).scalar_subquery()
                        )
                    )
                    .values(poll_queued_at=now)
                    .returning(MailboxCursor.mailbox)
                )
            )
        return marked


def _not_after(
    column: InstrumentedAttribute[datetime | None], moment: datetime
) -> ColumnElement[bool]:
    """``column`` is unset or at/before ``moment``."""
    return or_(column.is_(None), column <= moment)


async def mark_watched(
    sessions: async_sessionmaker[AsyncSession],
    mailboxes: Sequence[tuple[str, str]],
    *,
    for_s: float | None,
) -> None:
    """Say a watcher announces the new mail of these (mailbox, folder) pairs for ``for_s``
    seconds from now (None: no longer). Cursors not created yet are left for the first poll."""
    if not mailboxes:
        return
    async with lease_transaction(sessions) as session:
        until = None if for_s is None else func.now() + timedelta(seconds=for_s)
        await session.execute(
            update(MailboxCursor)
            .where(tuple_(MailboxCursor.mailbox, MailboxCursor.folder).in_(list(mailboxes)))
            .values(watched_until=until)
        )
