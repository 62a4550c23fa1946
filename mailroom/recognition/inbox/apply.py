"""The inbox: acks and results from recognition services (ARCHITECTURE.md, Recognition).

Messages are parsed outside the database, then a batch of them is applied in
one short transaction with no network I/O: ``SELECT … FOR UPDATE`` on the
batch's jobs (in id order, so concurrent batches never deadlock each other)
waits for whoever holds them (the publisher mid-batch, the watchdog), so the
first to lock a row decides and the others see its outcome. Each message's
rules run in Python against the locked rows, in arrival order (``inbox_rules.py``),
and the changes are written back with one statement per table, the whole batch in
three round trips (``inbox_write.py``). The handler is idempotent: a redelivered
message finds its effect already there and changes nothing.

A batch whose transaction fails is applied again one message per transaction,
so one message the database refuses never takes its neighbours down with it.
A batch's attempt is recorded before it is applied, so a message that kills its
worker ends its job after a bound (``inbox_attempts.py``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime

import psycopg
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.db.engine import psycopg_autocommit
from mailroom.db.params import uuid_array
from mailroom.recognition.contract.violations import fail_for_violation
from mailroom.recognition.inbox import write as inbox_write
from mailroom.recognition.inbox.attempts import apply_counted, end_batch_apart
from mailroom.recognition.inbox.messages import (
    InboxMessage,
    InboxOutcome,
    Parsed,
    parse_message,
)
from mailroom.recognition.inbox.rules import Batch, Job
from mailroom.recognition.inbox.rules import apply_one as _apply_one
from mailroom.settings import RecognitionSettings

logger = logging.getLogger(__name__)


def _apply_rules(parsed: Sequence[Parsed], jobs: Sequence[Job], now: datetime | None) -> Batch:
    batch = Batch()
    by_id = {job.id: job for job in jobs}
    for message in parsed:
        _apply_one(batch, by_id, message, now)  # looked up here: the fault tests hook it
    return batch


async def _apply_in_one_transaction(
    sessions: async_sessionmaker[AsyncSession], parsed: Sequence[Parsed], now: datetime | None
) -> Batch:
    """Messages applied in a transaction of their own (one by one): lock, apply, write back."""
    async with psycopg_autocommit(sessions) as pg:
        jobs = await inbox_write.lock(pg, uuid_array({p.response.job_id for p in parsed}))
        batch = _apply_rules(parsed, jobs, now)
        await inbox_write.write_back(pg, jobs, now, unkept=batch.unkept)
    batch.emit()
    return batch


async def apply_recognition_messages(
    sessions: async_sessionmaker[AsyncSession],
    messages: Sequence[InboxMessage],
    *,
    max_bytes: int,
    now: datetime | None = None,
    max_attempts: int = RecognitionSettings().max_processing_attempts,
    results_bucket: str | None = None,
) -> list[InboxOutcome]:
    """Apply a batch of acks and results; their outcomes, in message order.

    A result outside ``results_bucket`` (the configured one) fails its job as a contract
    violation; ``None`` leaves that check to mapping alone.

    One transaction for the whole batch. When it fails, each message is applied
    in its own transaction; one that fails there too gets a ``failed`` outcome
    carrying its error, for the caller to retry on its own. Raises when no
    message could be applied (the database is likely down: retry the batch),
    and at once when the connection was lost.
    """
    outcomes: list[InboxOutcome | None] = []
    parsed: list[tuple[int, Parsed]] = []
    for index, message in enumerate(messages):
        checked = parse_message(message, max_bytes=max_bytes, results_bucket=results_bucket)
        if isinstance(checked, InboxOutcome):
            outcomes.append(checked)
        else:
            outcomes.append(None)
            parsed.append((index, checked))
    if parsed:
        applied = await _apply_counted(sessions, [p for _, p in parsed], now, max_attempts)
        for (index, _), outcome in zip(parsed, applied, strict=True):
            outcomes[index] = outcome
    # After the batch: an answer to the same job in it wins over its broken message.
    return [await _settle_violation(sessions, o) for o in outcomes if o is not None]


async def _settle_violation(
    sessions: async_sessionmaker[AsyncSession], outcome: InboxOutcome
) -> InboxOutcome:
    """A message off the contract that names a waiting job fails that job at once."""
    if outcome.violation is None or outcome.job_id is None:
        return outcome
    finalized = await fail_for_violation(sessions, outcome.job_id, outcome.violation)
    if finalized is None:
        return outcome
    return InboxOutcome(
        "contract_violation",
        outcome.job_id,
        finalized_mail_ids=tuple(finalized),
        violation=outcome.violation,
    )


async def _apply_counted(
    sessions: async_sessionmaker[AsyncSession],
    parsed: Sequence[Parsed],
    now: datetime | None,
    max_attempts: int,
) -> list[InboxOutcome]:
    ids = uuid_array({p.response.job_id for p in parsed})
    attempt_id = uuid.uuid4()
    # The hold's locks live on this connection: any exception closes it, and they go with it.
    async with psycopg_autocommit(sessions) as pg:
        # A live batch holding one of these jobs (an ack beside its result) is waited for, not
        # taken for a death: only an attempt left by a dead batch sends this one one by one.
        dead, jobs = await inbox_write.hold_and_lock(pg, ids, attempt_id)
        if not dead:
            return await _apply_batch(
                sessions, parsed, now, pg=pg, jobs=jobs, attempt_id=attempt_id, ids=ids
            )
        # An earlier batch holding one of these jobs never came back: charge each message alone,
        # on its own job only (a batch's death says nothing about which of its messages killed it).
        await inbox_write.roll_back(pg, attempt_id=attempt_id)

        async def apply_alone(message: Parsed) -> list[InboxOutcome]:
            return (await _apply_in_one_transaction(sessions, [message], now)).outcomes

        async def counted(message: Parsed) -> list[InboxOutcome]:
            return await apply_counted(
                sessions, message, apply_alone, max_attempts=max_attempts, now=now
            )

        try:
            outcomes = await _apply_one_by_one(sessions, parsed, now, apply=counted)
            # Every message came back: their jobs are suspects no more (a death on the way
            # leaves the rows as they were, so the next delivery goes one by one again).
            await inbox_write.settle_dead_batches(pg, ids)
            return outcomes
        finally:
            await inbox_write.release(pg)


async def _apply_batch(
    sessions: async_sessionmaker[AsyncSession],
    parsed: Sequence[Parsed],
    now: datetime | None,
    *,
    pg: inbox_write.Connection,
    jobs: list[Job],
    attempt_id: uuid.UUID,
    ids: str,
) -> list[InboxOutcome]:
    """The batch's locked jobs applied and written back; its commit ends its attempt.

    A batch that fails is applied one by one, and its attempt is ended apart after
    that, however it ends (a death meanwhile leaves it recorded).
    """
    try:
        batch = _apply_rules(parsed, jobs, now)
        await inbox_write.write_back(
            pg, jobs, now, attempt_id=attempt_id, release=True, ids=ids, unkept=batch.unkept
        )
        batch.emit()
        return batch.outcomes
    except Exception as exc:
        if len(parsed) == 1 or _connection_lost(exc):
            await end_batch_apart(sessions, attempt_id)
            raise
        logger.warning(
            "Recognition batch of %d messages failed (%s); applying them one by one",
            len(parsed),
            type(exc).__name__,
        )
    except BaseException:
        await end_batch_apart(sessions, attempt_id)
        raise
    try:
        await inbox_write.roll_back(pg)
        return await _apply_one_by_one(sessions, parsed, now)
    finally:
        await end_batch_apart(sessions, attempt_id)
        await inbox_write.release(pg)


async def _apply_one_by_one(
    sessions: async_sessionmaker[AsyncSession],
    parsed: Sequence[Parsed],
    now: datetime | None,
    *,
    apply: Callable[[Parsed], Awaitable[list[InboxOutcome]]] | None = None,
) -> list[InboxOutcome]:
    applied: list[InboxOutcome] = []
    first_error: Exception | None = None
    for message in parsed:
        try:
            if apply is not None:
                applied += await apply(message)
            else:
                applied += (await _apply_in_one_transaction(sessions, [message], now)).outcomes
        except Exception as exc:
            if _connection_lost(exc):
                raise
            first_error = first_error or exc
            logger.warning(
                "Recognition message for job %s failed on its own: %s",
                message.response.job_id,
                type(exc).__name__,
            )
            applied.append(InboxOutcome("failed", message.response.job_id, error=exc))
    if first_error is not None and all(o.applied == "failed" for o in applied):
        raise first_error
    return applied


def _connection_lost(exc: Exception) -> bool:
    if isinstance(exc, psycopg.OperationalError):
        # No SQLSTATE: the client lost the server; 08: connection errors; 57P: shutdowns.
        state = exc.sqlstate
        return state is None or state.startswith(("08", "57P"))
    return isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated


async def apply_recognition_message(
    sessions: async_sessionmaker[AsyncSession],
    *,
    subject: str,
    data: bytes,
    headers: Mapping[str, str],
    max_bytes: int,
    max_attempts: int = RecognitionSettings().max_processing_attempts,
    now: datetime | None = None,
    results_bucket: str | None = None,
) -> InboxOutcome:
    """Apply one ack or result; database errors propagate (the caller retries)."""
    [outcome] = await apply_recognition_messages(
        sessions,
        [InboxMessage(subject, data, headers)],
        max_bytes=max_bytes,
        max_attempts=max_attempts,
        now=now,
        results_bucket=results_bucket,
    )
    return outcome
