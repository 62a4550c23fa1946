"""One batch of a leased mailbox: connect, SELECT, read new UIDs, ingest each in order.

The next FETCH chunk (bounded in mails and in bytes, by SEARCH LARGER) is read
while the current one is ingested; a mail over ``max_mail_bytes`` (SEARCH LARGER
again) is read as its headers and size alone. Mails go in groups (``commit_group``, also
bounded in bytes): a group is parsed and its objects stored while the group
before it commits. Commits stay one transaction per mail, in UID order, each
fenced on the lease; a group's transactions are pipelined to Postgres in one
round trip. So a poll holds two chunks and three groups of mail at most. The
IMAP connection is closed on every exit, and a failure to close never replaces
the error that ended the batch.

Before it parses, a batch counts its attempt (``cursor.count_attempt``): one for
the whole batch when no earlier attempt was left over, written while the first
chunk is fetched. When one was (a worker died in an earlier poll), the batch
reads, parses and commits one mail at a time, counting at each UID first, and
blocks the cursor at a UID whose attempts ran out without reading it. Such a mail is read
while no other poll of the process parses (``suspects.py``), so the death it is charged
with is its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.adapters.imap import FetchedMail, Mailbox
from mailroom.adapters.storage import ObjectStore
from mailroom.db.engine import psycopg_autocommit
from mailroom.errors import ClaimsExhausted, LeaseLost, MailFailed
from mailroom.intake.after_ingest import apply_after_ingest
from mailroom.intake.cursor import Claim, adopt_uidvalidity, count_attempt
from mailroom.intake.ingest import (
    Committed,
    PreparedGroup,
    PreparedMail,
    commit_group,
    prepare_group,
)
from mailroom.intake.parsing import Limits
from mailroom.intake.suspects import parse_gate
from mailroom.intake.tombstones import drop_unregistered, erased_among
from mailroom.settings import IntakeSettings, MailboxSettings

logger = logging.getLogger(__name__)

Nudge = Callable[[], Awaitable[None]]


@dataclass
class BatchResult:
    uidvalidity: int = 0
    #: Highest UID scanned; the cursor advances to it when the batch ends well.
    highest_uid: int = 0
    ingested: int = 0
    duplicates: int = 0
    #: Mails an erasure left a tombstone of, read again and skipped.
    erased: int = 0
    jobs: int = 0
    #: Stored mails that opened no recognition job: final at once, their notifications due.
    final: int = 0
    #: More new mail than ``batch_size`` was waiting.
    more_waiting: bool = False
    #: Seconds from the batch's start until it knew its new UIDs (connect, SELECT, SEARCH).
    setup_s: float = 0.0


@dataclass
class Attempt:
    """The attempt this batch counted, for the poll to give back however the batch ends."""

    #: The UID it was last counted at; None before the batch counted one.
    uid: int | None = None


@dataclass(frozen=True)
class BatchContext:
    """Everything one batch works with."""

    claim: Claim
    mailbox: MailboxSettings
    intake: IntakeSettings
    sessions: async_sessionmaker[AsyncSession]
    store: ObjectStore
    nudge: Nudge
    attempt: Attempt = field(default_factory=Attempt)

    @property
    def limits(self) -> Limits:
        return Limits.for_mailbox(self.intake, self.mailbox)

    async def erased(self, mails: Sequence[tuple[str, str | None]]) -> list[bool]:
        return await erased_among(self.sessions, mails)


async def run_batch(ctx: BatchContext, connection: Mailbox) -> BatchResult:
    """Read and ingest the new mail of one folder; the connection is always closed."""
    try:
        return await _read_folder(ctx, connection)
    finally:
        try:
            await connection.close()
        except Exception:  # close() should log its own trouble; this is the backstop
            logger.warning("Closing mailbox %s failed", ctx.mailbox.name, exc_info=True)


async def _read_folder(ctx: BatchContext, connection: Mailbox) -> BatchResult:
    started = time.monotonic()
    await connection.connect()
    await connection.check_health()
    uidvalidity = await connection.select(ctx.mailbox.folder)
    above = await adopt_uidvalidity(ctx.sessions, ctx.claim, uidvalidity)
    result = BatchResult(uidvalidity=uidvalidity, highest_uid=above)
    # A poll reads what is there and ends: new mail is announced to the watcher
    # (``mailroom bridge imap``), which sends the next poll, never waited for here.
    uids = await connection.uids_above(above)
    result.setup_s = time.monotonic() - started
    result.more_waiting = len(uids) > ctx.mailbox.batch_size
    uids = uids[: ctx.mailbox.batch_size]
    if uids:
        try:
            if ctx.claim.attempt_count > 0:
                logger.warning(
                    "Mailbox %s: %d earlier attempt(s) ended without an outcome; "
                    "reading mail by mail from UID %d",
                    ctx.mailbox.name,
                    ctx.claim.attempt_count,
                    uids[0],
                )
                await _ingest_one_by_one(ctx, connection, uids, result)
            else:
                async with parse_gate().shared():
                    await _ingest_in_order(ctx, connection, uids, result, above=above)
        except MailFailed as exc:
            exc.uidvalidity = result.uidvalidity
            raise
        result.highest_uid = uids[-1]
    return result


def _exhausted(ctx: BatchContext, uid: int, deaths: int) -> MailFailed:
    """The mail at ``uid`` took its worker down each time it was read: it is not read again."""
    cause = ClaimsExhausted(
        f"{deaths} attempts in a row at UID {uid} ended without an outcome (the worker died)"
    )
    failed = MailFailed(uid, None, cause)
    failed.exhausted = True
    return failed


def _pipeline(ctx: BatchContext) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
    """One connection for the batch's per-mail transactions: no pool checkout per mail.

    Autocommit: each mail's transaction is spelled out (BEGIN … COMMIT) in the pipeline.
    A batch that ends in ``MailFailed`` or ``LeaseLost`` ended the pipeline cleanly; any
    other end closes the connection. Transactions Postgres already ran are whole and
    fenced, and the cursor row says how far they got.
    """
    return psycopg_autocommit(ctx.sessions, clean=(MailFailed, LeaseLost))


async def _ingest_one_by_one(
    ctx: BatchContext, connection: Mailbox, uids: list[int], result: BatchResult
) -> None:
    """Read, parse and commit one mail at a time, each counted at its UID before it is read.

    So when a worker dies, the count stays at the mail it died on, and the mails
    before it are stored. Each mail is read alone in its process, from its count to its
    commit: no other poll's mail can have taken the worker down meanwhile.
    """
    oversize = await connection.larger_than(uids, ctx.intake.max_mail_bytes)
    gate = parse_gate()
    async with _pipeline(ctx) as pg:
        for uid in uids:
            async with gate.alone():
                count = await count_attempt(ctx.sessions, ctx.claim, uid)
                ctx.attempt.uid = uid
                if count > ctx.intake.max_retries:
                    raise _exhausted(ctx, uid, count - 1)
                mails = await _fetch(connection, [uid], oversize)
                prepared = await prepare_group(
                    mails, store=ctx.store, limits=ctx.limits, erased=ctx.erased
                )
                await _commit(ctx, pg, connection, prepared, result)


async def _count_batch(ctx: BatchContext, above: int) -> None:
    """The batch's one attempt, at the UID it reads above: it blames no mail."""
    await count_attempt(ctx.sessions, ctx.claim, above)
    ctx.attempt.uid = above


async def _ingest_in_order(
    ctx: BatchContext, connection: Mailbox, uids: list[int], result: BatchResult, *, above: int
) -> None:
    # The attempt is written while the first chunk is fetched, and before any mail is parsed.
    counting: asyncio.Task[None] | None = asyncio.create_task(_count_batch(ctx, above))
    window: deque[asyncio.Task[PreparedGroup]] = deque()
    fetching: asyncio.Task[list[FetchedMail]] | None = None
    try:
        chunks, oversize = await _fetch_chunks(ctx.intake, connection, uids)
        fetching = asyncio.create_task(_fetch(connection, chunks[0], oversize))
        async with _pipeline(ctx) as pg:
            for index in range(len(chunks)):
                assert fetching is not None
                # Groups taken off one by one: a prepared group then holds the only reference to
                # its mails, and their bytes go once they are stored (``prepare_group``).
                groups = deque(
                    bounded_runs(
                        await fetching,
                        lambda mail: len(mail.raw),
                        max_items=ctx.intake.commit_group,
                        max_bytes=GROUP_BYTES,
                    )
                )
                # One IMAP command at a time: the next chunk is read while this one is ingested.
                fetching = (
                    asyncio.create_task(_fetch(connection, chunks[index + 1], oversize))
                    if index + 1 < len(chunks)
                    else None
                )
                if counting is not None:
                    await counting
                    counting = None
                while groups:
                    prepare = prepare_group(
                        groups.popleft(), store=ctx.store, limits=ctx.limits, erased=ctx.erased
                    )
                    window.append(asyncio.create_task(prepare))
                    if len(window) > GROUPS_AHEAD:
                        await _commit_next(ctx, pg, connection, window, result)
            while window:
                await _commit_next(ctx, pg, connection, window, result)
    finally:
        pending: list[asyncio.Task[Any]] = list(window)
        if fetching is not None:
            pending.append(fetching)
        for leftover in pending:
            leftover.cancel()
        if counting is not None:
            # Not cancelled: a short write, and once it is done the poll knows what to give back.
            pending.append(counting)
        if pending:
            # Let cancelled work finish its cleanup before the connection is closed.
            await asyncio.wait(pending)
            for leftover in pending:
                if not leftover.cancelled():
                    leftover.exception()  # retrieved: the error that counts is already raised


async def _fetch_chunks(
    intake: IntakeSettings, connection: Mailbox, uids: list[int]
) -> tuple[list[list[int]], set[int]]:
    """``uids`` cut into FETCH commands, and those of them over ``max_mail_bytes``.

    A command fetches at most ``fetch_chunk`` mails and ``fetch_chunk_bytes``; of a mail
    over ``max_mail_bytes`` only the headers and size are fetched.
    """
    count, most = max(1, intake.fetch_chunk), intake.fetch_chunk_bytes
    # A full chunk of mails up to ``share`` bytes each stays within ``most``; bigger mails are
    # fetched alone. The server says which are bigger: no mail is measured here.
    share = max(1, most // count)
    big = await connection.larger_than(uids, share) if len(uids) > 1 else set()
    # Mails over the limit are among the big ones: a second SEARCH only when there are any.
    suspects = sorted(big) if len(uids) > 1 and share <= intake.max_mail_bytes else uids
    oversize = await connection.larger_than(suspects, intake.max_mail_bytes) if suspects else set()
    chunks = bounded_runs(
        uids, lambda uid: most if uid in big else share, max_items=count, max_bytes=most
    )
    return chunks, oversize


async def _fetch(connection: Mailbox, uids: list[int], oversize: set[int]) -> list[FetchedMail]:
    """The mails of ``uids`` in UID order: whole, or headers alone for those in ``oversize``."""
    whole = [uid for uid in uids if uid not in oversize]
    mails = await connection.fetch(whole) if whole else []
    if heads := [uid for uid in uids if uid in oversize]:
        mails = sorted(mails + await connection.fetch_headers(heads), key=lambda m: m.uid)
    return mails


#: Groups parsed and stored ahead of the one being committed (commits stay in UID order).
GROUPS_AHEAD = 2
#: Most bytes of mail in one commit group (a bigger mail is a group of its own).
GROUP_BYTES = 16 * 1024 * 1024

T = TypeVar("T")


def bounded_runs(
    items: list[T], size_of: Callable[[T], int], *, max_items: int, max_bytes: int
) -> list[list[T]]:
    """``items`` in order, cut into runs of at most ``max_items`` and ``max_bytes``.

    An item bigger than ``max_bytes`` is a run of its own; no run is empty.
    """
    runs: list[list[T]] = []
    run: list[T] = []
    run_bytes = 0
    for item in items:
        size = size_of(item)
        if run and (len(run) >= max(1, max_items) or run_bytes + size > max_bytes):
            runs.append(run)
            run, run_bytes = [], 0
        run.append(item)
        run_bytes += size
    if run:
        runs.append(run)
    return runs


async def _commit_next(
    ctx: BatchContext,
    pg: psycopg.AsyncConnection[Any],
    connection: Mailbox,
    window: deque[asyncio.Task[PreparedGroup]],
    result: BatchResult,
) -> None:
    prepared = await window[0]
    window.popleft()
    await _commit(ctx, pg, connection, prepared, result)


async def _commit(
    ctx: BatchContext,
    pg: psycopg.AsyncConnection[Any],
    connection: Mailbox,
    prepared: PreparedGroup,
    result: BatchResult,
) -> None:
    """Commit a group, then run the mailbox's after-ingest action on the mails it committed."""
    if prepared.mails:
        outcome = await commit_group(pg, ctx.claim, prepared.mails, uidvalidity=result.uidvalidity)
        if _count(ctx, prepared.mails, outcome.committed, result):
            try:
                await ctx.nudge()
            except Exception:  # the jobs are committed; the outbox sweep publishes them anyway
                logger.warning("Nudging the recognition publisher failed", exc_info=True)
        if outcome.orphaned:  # an erase committed while these mails were prepared
            await drop_unregistered(ctx.sessions, outcome.orphaned)
        # Duplicates too: their content is stored, under an earlier UID.
        committed = [mail.uid for mail in outcome.committed]
        await apply_after_ingest(ctx.mailbox, connection, committed)
        if outcome.error is not None:
            raise outcome.error
    if prepared.failure is not None:
        raise prepared.failure


def _count(
    ctx: BatchContext, mails: list[PreparedMail], committed: list[Committed], result: BatchResult
) -> int:
    """Add the committed mails to the result; the number of recognition jobs they opened."""
    jobs = 0
    for mail, outcome in zip(mails, committed, strict=False):  # committed may stop early
        if outcome.erased:
            result.erased += 1
            logger.info(
                "Mailbox %s: UID %d matches an erased mail; skipped", ctx.mailbox.name, outcome.uid
            )
            continue
        if outcome.duplicate:
            result.duplicates += 1
            logger.info(
                "Mailbox %s: UID %d (%r) was ingested before; skipped",
                ctx.mailbox.name,
                outcome.uid,
                (mail.parsed.message_id or "")[:200],
            )
            continue
        result.ingested += 1
        result.jobs += outcome.jobs
        if outcome.jobs == 0:
            result.final += 1
        jobs += outcome.jobs
        # DEBUG: the poll's INFO line counts them (a line per mail cost intake about 3 % of
        # its CPU in a many-mailbox run); a skipped duplicate keeps its INFO line.
        logger.debug(
            "Mailbox %s: stored UID %d as mail %s with %d file(s), %d job(s)",
            ctx.mailbox.name,
            outcome.uid,
            outcome.mail_id,
            len(mail.parsed.attachments),
            outcome.jobs,
        )
    return jobs
