"""Mapping: result files become ``document`` rows and settle their files (ARCHITECTURE.md).

A batch of jobs (the results of one inbox batch) is mapped together: the jobs
are loaded in one statement, their result JSON read from the object store
concurrently and outside any transaction, and the decisions written in one short
transaction that locks the jobs and re-checks ``mapped_at`` (``mapping_write.py``),
so a redelivered, retried or swept mapping changes nothing twice.
An ``error`` result of a retryable class is replayed as a new attempt until
``automatic_attempts`` are spent; a permanent error, a result document off the
contract and a file that needs a check settle at once, as ERROR or NEEDS_CHECK
(the rule book, ``contract/rules.py``; ``verdict.py``).

Each try is counted on the jobs before their results are read (``attempts.py``).
A batch counts ``mapping_batch_attempts``; a job with a count left over (an
attempt at it never came back) is a suspect, mapped alone under the advisory lock
suspects share and counted on its own ``mapping_attempts``: a result whose mapping
kills the worker settles its file as ERROR (``MAPPING_ATTEMPTS_EXHAUSTED``) after
``max_processing_attempts`` such deaths, and its neighbours map on their turn.
An attempt that comes back, however it ended, is uncounted again. A job whose
read or write fails fails alone: its outcome is ``failed``, for the caller to
retry it on its own. When the last file of a mail settles, the mail is final and
the outcome says so (``finalized_mail_ids``): the hook for notifications.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.db.engine import autocommit
from mailroom.recognition import attempts
from mailroom.recognition.contract import rules
from mailroom.recognition.contract.models import UNKNOWN_SERVICE
from mailroom.recognition.contract.violations import (
    FOREIGN_BUCKET,
    INVALID_RESULT,
    RESULT_TOO_LARGE,
    Violation,
    report_violation,
)
from mailroom.recognition.finality import MAX_REASON_CHARS
from mailroom.recognition.mapping.verdict import (
    MAPPING_ACTOR,
    MAPPING_ATTEMPTS_EXHAUSTED,
    RESULT_STATUSES,
    Decision,
    MappingOutcome,
    ResultReader,
    Unusable,
    Verdict,
    judge,
    load_result,
)
from mailroom.recognition.mapping.write import write_decisions
from mailroom.settings import RecognitionSettings

__all__ = [
    "FOREIGN_BUCKET",
    "INVALID_RESULT",
    "MAPPING_ACTOR",
    "MAPPING_ATTEMPTS_EXHAUSTED",
    "RESULT_STATUSES",
    "RESULT_TOO_LARGE",
    "MappingOutcome",
    "ResultReader",
    "Unusable",
    "Verdict",
    "find_unmapped_results",
    "judge",
    "load_result",
    "map_recognition_result",
    "map_recognition_results",
]

logger = logging.getLogger(__name__)

#: Result files of one batch read from the object store at once.
READ_CONCURRENCY = 8


def _count_sql(key: str) -> str:
    return (
        f"CASE WHEN jsonb_typeof(j.metrics -> '{key}') = 'number' "
        f"THEN CAST(j.metrics ->> '{key}' AS integer) ELSE 0 END"
    )


_LOAD = text(
    f"""
    SELECT j.id, j.status, j.attempt, j.mapped_at, j.error_code, j.error_message,
           j.result_msg_id, j.service_name, o.bucket, o.key,
           j.metrics ->> '{rules.ERROR_CLASS_KEY}' AS error_class,
           {_count_sql(attempts.MAPPING_ATTEMPTS)} AS deaths,
           {_count_sql(attempts.MAPPING_BATCH_ATTEMPTS)} AS batch_deaths
      FROM recognition_job AS j
      LEFT JOIN stored_object AS o ON o.id = j.result_object_id
     WHERE j.id = ANY(:ids)
    """
)


async def map_recognition_result(
    sessions: async_sessionmaker[AsyncSession],
    store: ResultReader,
    job_id: uuid.UUID,
    *,
    settings: RecognitionSettings,
    now: datetime | None = None,
) -> MappingOutcome:
    """Map one job's result; idempotent (a mapped job is left alone); errors propagate."""
    [outcome] = await map_recognition_results(sessions, store, [job_id], settings=settings, now=now)
    return outcome


async def map_recognition_results(
    sessions: async_sessionmaker[AsyncSession],
    store: ResultReader,
    job_ids: Sequence[uuid.UUID],
    *,
    settings: RecognitionSettings,
    now: datetime | None = None,
) -> list[MappingOutcome]:
    """Map the jobs' results; one outcome per distinct job id, in order; idempotent by job.

    A job whose read or write fails gets a ``failed`` outcome carrying its error;
    when every job that was tried failed, the first error is raised instead (the
    database or the store is likely down: retry the batch).
    """
    ids = list(dict.fromkeys(job_ids))
    if not ids:
        return []
    async with autocommit(sessions) as connection:
        loaded = {row.id: row for row in await connection.execute(_LOAD, {"ids": ids})}
    outcomes: dict[uuid.UUID, MappingOutcome] = {}
    todo = []
    for job_id in ids:
        skipped = _skipped(job_id, loaded.get(job_id))
        if skipped is None:
            todo.append(loaded[job_id])
        else:
            outcomes[job_id] = skipped
    suspects = [job for job in todo if job.deaths > 0 or job.batch_deaths > 0]
    fresh = [job for job in todo if not (job.deaths > 0 or job.batch_deaths > 0)]
    if len(fresh) == 1:
        # A batch of one that dies names its job: count it on the job's own key at once.
        outcomes.update(await _map_alone(sessions, store, fresh, settings, now, suspect=False))
    elif fresh:
        mapped, raced = await _map_counted_batch(sessions, store, fresh, settings, now)
        outcomes.update(mapped)
        suspects += raced
    outcomes.update(await _map_alone(sessions, store, suspects, settings, now, suspect=True))
    tried = [outcomes[job.id] for job in todo]
    failed = [o for o in tried if o.applied == "failed"]
    if failed and len(failed) == len(tried) and failed[0].error is not None:
        raise failed[0].error
    return [outcomes[job_id] for job_id in ids]


def _skipped(job_id: uuid.UUID, job: Any) -> MappingOutcome | None:
    """The outcome of a job there is nothing to map for; None when it is to be mapped."""
    if job is None:
        logger.warning("Mapping skipped: recognition job %s does not exist", job_id)
        return MappingOutcome(job_id, "unknown_job")
    if job.mapped_at is not None:
        return MappingOutcome(job_id, "already_mapped")
    if job.status not in RESULT_STATUSES or job.result_msg_id is None:
        # NOTE: an INVALID_REQUEST error never reached a service: there is no result to map.
        logger.warning(
            "Mapping skipped: recognition job %s is %s, not a result", job_id, job.status
        )
        return MappingOutcome(job_id, "not_a_result")
    return None


async def _map_counted_batch(
    sessions: async_sessionmaker[AsyncSession],
    store: ResultReader,
    jobs: list[Any],
    settings: RecognitionSettings,
    now: datetime | None,
) -> tuple[dict[uuid.UUID, MappingOutcome], list[Any]]:
    """Count one batch attempt on each job, map them together, give the attempts back.

    Returns the outcomes and the jobs left for the suspects' way (not mapped here).
    """
    counts = await attempts.count_attempts(
        sessions, [job.id for job in jobs], attempts.MAPPING_BATCH_ATTEMPTS
    )
    # A count other than this one appeared since the load (a death, or a parallel attempt):
    # such a job goes the suspects' way, alone.
    raced = [job for job in jobs if counts.get(job.id) != 1]
    if raced:
        await attempts.give_back(
            sessions, [job.id for job in raced], attempts.MAPPING_BATCH_ATTEMPTS
        )
    batch = [job for job in jobs if counts.get(job.id) == 1]
    given_back: set[uuid.UUID] = set()
    try:
        return await _map_batch(sessions, store, batch, settings, now, given_back), raced
    finally:
        # However it ended, this attempt came back: only attempts that died stay counted.
        # The batch's write gave back its own jobs' attempts when it committed.
        await attempts.give_back(
            sessions,
            [job.id for job in batch if job.id not in given_back],
            attempts.MAPPING_BATCH_ATTEMPTS,
        )


async def _map_batch(
    sessions: async_sessionmaker[AsyncSession],
    store: ResultReader,
    jobs: list[Any],
    settings: RecognitionSettings,
    now: datetime | None,
    given_back: set[uuid.UUID],
) -> dict[uuid.UUID, MappingOutcome]:
    """Decide the jobs, write the decisions together; ``given_back`` gets the jobs whose
    batch attempt the write gave back."""
    if not jobs:
        return {}
    reads = asyncio.Semaphore(READ_CONCURRENCY)

    async def decide_one(job: Any) -> Decision:
        async with reads:
            return await _decide(store, job, settings)

    decided = await asyncio.gather(*(decide_one(job) for job in jobs), return_exceptions=True)
    outcomes: dict[uuid.UUID, MappingOutcome] = {}
    decisions = []
    for job, decision in zip(jobs, decided, strict=True):
        if isinstance(decision, Decision):
            decisions.append(decision)
        elif isinstance(decision, Exception):
            outcomes[job.id] = _failed(job.id, decision)
        else:  # cancellation or an exit: not this job's failure
            raise decision
    if not decisions:
        return outcomes
    try:
        written = await write_decisions(
            sessions, decisions, now=now, give_back=attempts.MAPPING_BATCH_ATTEMPTS
        )
        given_back.update(decision.job_id for decision in decisions)
    except Exception as exc:
        if _connection_lost(exc):
            raise
        if len(decisions) == 1:
            written = [_failed(decisions[0].job_id, exc)]
        else:
            logger.warning(
                "Mapping batch of %d jobs failed (%s); writing them one by one",
                len(decisions),
                type(exc).__name__,
            )
            written = [await _write_alone(sessions, decision, now) for decision in decisions]
    outcomes.update({outcome.job_id: outcome for outcome in written})
    return outcomes


async def _write_alone(
    sessions: async_sessionmaker[AsyncSession], decision: Decision, now: datetime | None
) -> MappingOutcome:
    try:
        [outcome] = await write_decisions(sessions, [decision], now=now)
    except Exception as exc:
        if _connection_lost(exc):
            raise
        return _failed(decision.job_id, exc)
    return outcome


async def _map_alone(
    sessions: async_sessionmaker[AsyncSession],
    store: ResultReader,
    jobs: list[Any],
    settings: RecognitionSettings,
    now: datetime | None,
    *,
    suspect: bool,
) -> dict[uuid.UUID, MappingOutcome]:
    """Map each job on its own, counted on its own ``mapping_attempts``.

    A suspect waits for its turn under the advisory lock *before* it counts, so that
    a neighbour's death (a poison result redelivered with it) is not counted on it.
    """
    outcomes = {}
    for job in jobs:
        turn = attempts.alone(sessions, attempts.ALONE_KEY) if suspect else nullcontext()
        try:
            async with turn:
                outcomes[job.id] = await _counted(sessions, store, job, settings, now)
        except Exception as exc:
            if _connection_lost(exc):
                raise
            outcomes[job.id] = _failed(job.id, exc)
    return outcomes


async def _counted(
    sessions: async_sessionmaker[AsyncSession],
    store: ResultReader,
    job: Any,
    settings: RecognitionSettings,
    now: datetime | None,
) -> MappingOutcome:
    """Count the attempt, then map (or settle the job as exhausted); give the attempt back."""
    counts = await attempts.count_attempts(sessions, [job.id], attempts.MAPPING_ATTEMPTS)
    tries = counts[job.id]
    given_back = False
    try:
        if tries > settings.max_processing_attempts:
            # Not replayed: a new attempt would likely bring the result that killed its workers.
            exhausted = Unusable(
                MAPPING_ATTEMPTS_EXHAUSTED, f"mapping did not finish in {tries - 1} attempts"
            )
            logger.error("Result of job %s: %s", job.id, exhausted.message)
            verdict = Verdict(
                "ERROR", reason=f"{exhausted.code}: {exhausted.message}", invalid_result=exhausted
            )
            decision = Decision(job.id, verdict, retry=False)
        else:
            decision = await _decide(store, job, settings)
        [outcome] = await write_decisions(
            sessions, [decision], now=now, give_back=attempts.MAPPING_ATTEMPTS
        )
        given_back = True
        return outcome
    finally:
        # However it ended, this attempt came back: only attempts that died stay counted
        # (a committed write gave it back already).
        if not given_back:
            await attempts.give_back(sessions, [job.id], attempts.MAPPING_ATTEMPTS)


async def _decide(store: ResultReader, job: Any, settings: RecognitionSettings) -> Decision:
    """The verdict on a job's result (read from the store unless the job is an ``error``)."""
    if job.status == "error":
        reason = f"{job.error_code or 'SERVICE_ERROR'}: {job.error_message or ''}"
        # The class the inbox recorded from the answer; a job older than classes: its code's.
        recorded = job.error_class if job.error_class in ("retryable", "permanent") else None
        error_class = recorded or rules.error_class(job.error_code)
        verdict = Verdict("ERROR", reason=reason[:MAX_REASON_CHARS], error_class=error_class)
    else:
        # NOTE: looked up on this module at each call, so fault probes can wrap it.
        loaded = await load_result(
            store, job.bucket, job.key, job_id=job.id, max_bytes=settings.max_result_bytes
        )
        if isinstance(loaded, Unusable):
            service = (job.service_name or UNKNOWN_SERVICE)[: rules.MAX_SERVICE_CHARS]
            violation = Violation(loaded.code.lower(), loaded.message, service)
            report_violation(violation, job_id=job.id, where="result document")
            verdict = Verdict(
                "ERROR",
                reason=f"{loaded.code}: {loaded.message}"[:MAX_REASON_CHARS],
                error_class=rules.error_class(loaded.code),
                invalid_result=loaded,
            )
        else:
            verdict = judge(loaded, service_status=job.status, settings=settings)
    retry = rules.is_retried(
        verdict.error_class, attempt=job.attempt, automatic_attempts=settings.automatic_attempts
    )
    return Decision(job.id, verdict, retry=retry)


def _failed(job_id: uuid.UUID, exc: Exception) -> MappingOutcome:
    logger.warning("Mapping of job %s failed: %s", job_id, type(exc).__name__)
    return MappingOutcome(job_id, "failed", error=exc)


def _connection_lost(exc: Exception) -> bool:
    return isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated


_UNMAPPED = text(
    """
    SELECT id FROM recognition_job
     WHERE status IN ('done', 'needs_check', 'error')
       AND mapped_at IS NULL
       AND result_msg_id IS NOT NULL
       AND finished_at < COALESCE(CAST(:now AS timestamptz), now()) - make_interval(secs => :after_s)
     ORDER BY finished_at
     LIMIT :limit
    """
)


async def find_unmapped_results(
    sessions: async_sessionmaker[AsyncSession],
    *,
    settings: RecognitionSettings,
    now: datetime | None = None,
) -> list[uuid.UUID]:
    """Results left unmapped longer than ``unmapped_after_s``: the sweep re-sends these."""
    params = {"now": now, "after_s": settings.unmapped_after_s, "limit": settings.sweep_batch_size}
    async with sessions() as session:
        rows = await session.execute(_UNMAPPED, params)
        return [job_id for (job_id,) in rows]
