"""Attempts at a job's work counted in Postgres before the work (bounded attempts).

Dramatiq's retry count moves only when an actor raises. A process that dies
instead (``os._exit``, the OOM killer, a segfault in a C library) leaves its
message to be redelivered with the count unchanged, so a result that kills its
worker would loop forever. The inbox and mapping therefore count an attempt in
the job's ``metrics`` and commit it before they start, and give it back when
the attempt ends, however it ends: applied, settled as exhausted, or raised
(those are bounded by the actor's retry policy, and an outage must not use up a
job's attempts). What stays counted is the attempts that never came back, so a
job no worker died on has no key; past the maximum the job fails with a reason.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.db.engine import autocommit
from mailroom.db.params import uuid_array

logger = logging.getLogger(__name__)

#: ``metrics`` keys of the counts.
MAPPING_ATTEMPTS = "mapping_attempts"
#: Mapping's attempts at whole batches: as in the inbox, a death there only makes each job of
#: the batch a suspect, mapped alone and counted on its own ``mapping_attempts``.
MAPPING_BATCH_ATTEMPTS = "mapping_batch_attempts"
#: The inbox's attempts at one message alone: the count its job fails on.
INBOX_ATTEMPTS = "inbox_attempts"

# Rows locked in id order, so two batches counting the same jobs wait instead of deadlocking.
# A count back at zero leaves no key: a job nothing ever died on keeps the metrics it had.
# The ``= ANY`` steers the planner to the primary key (it cannot size the CTE, and would
# join it to a scan of the whole table).
_COUNT = text(
    """
    WITH locked AS (
        SELECT id, COALESCE(metrics, '{}'::jsonb) AS metrics,
               COALESCE(CAST(metrics ->> CAST(:key AS text) AS integer), 0) + :step AS n
          FROM recognition_job WHERE id = ANY(CAST(:ids AS uuid[])) ORDER BY id FOR UPDATE
    )
    UPDATE recognition_job AS j
       SET metrics = CASE WHEN locked.n > 0
                          THEN jsonb_set(locked.metrics, ARRAY[CAST(:key AS text)], to_jsonb(locked.n))
                          ELSE locked.metrics - CAST(:key AS text) END
      FROM locked
     WHERE j.id = locked.id AND j.id = ANY(CAST(:ids AS uuid[]))
    RETURNING j.id, GREATEST(locked.n, 0) AS attempts
    """
)


async def _add(
    sessions: async_sessionmaker[AsyncSession], job_ids: Collection[uuid.UUID], key: str, step: int
) -> dict[uuid.UUID, int]:
    """One statement, committed on its own: in autocommit, no ``BEGIN`` / ``COMMIT`` round trips."""
    ids = uuid_array(sorted(set(job_ids)))
    async with autocommit(sessions) as connection:
        rows = await connection.execute(_COUNT, {"ids": ids, "key": key, "step": step})
        return {job_id: int(attempts) for job_id, attempts in rows}


async def count_attempts(
    sessions: async_sessionmaker[AsyncSession], job_ids: Collection[uuid.UUID], key: str
) -> dict[uuid.UUID, int]:
    """Count one attempt on each job, committed; each job's attempts so far, this one included."""
    if not job_ids:
        return {}
    return await _add(sessions, job_ids, key, 1)


async def give_back(
    sessions: async_sessionmaker[AsyncSession], job_ids: Collection[uuid.UUID], key: str
) -> None:
    """Uncount attempts that came back; best effort, an error of the attempt wins."""
    if not job_ids:
        return
    try:
        await _add(sessions, job_ids, key, -1)
    except Exception:  # the database may be why the attempt failed: the count then stays
        logger.warning("Could not give back %s of %d job(s)", key, len(job_ids), exc_info=True)


async def give_back_in(session: AsyncSession, job_ids: Collection[uuid.UUID], key: str) -> None:
    """Uncount attempts in the caller's transaction, so the give-back commits with the work
    it ends (one commit, not two) and goes with it when that work rolls back."""
    if job_ids:
        ids = uuid_array(sorted(set(job_ids)))
        await session.execute(_COUNT, {"ids": ids, "key": key, "step": -1})


#: The advisory lock under which a suspect attempt runs alone: one for the inbox and mapping,
#: as a death in one charges the other's attempts in flight in the same process too.
ALONE_KEY = 0x7265_636F  # "reco"
#: How long a suspect attempt waits for its turn before it is retried later, in seconds.
ALONE_WAIT_S = 30.0


@asynccontextmanager
async def alone(
    sessions: async_sessionmaker[AsyncSession], key: int, *, wait_s: float = ALONE_WAIT_S
) -> AsyncIterator[None]:
    """Run the block as the only suspect attempt of its kind, system-wide.

    A death charges every attempt in flight in that process: an innocent job
    redelivered together with a poison one would run beside it again and again
    and run out of attempts with it. So an attempt that finds a death already
    counted (a suspect) runs under a transaction-level advisory lock: suspects
    never share a death, and an innocent one succeeds on its turn. The lock goes
    with the transaction, or with the connection when the process dies. Waiting
    longer than ``wait_s`` raises (Postgres's lock timeout): the actor retries.
    """
    async with sessions() as session, session.begin():
        timeout = f"{max(1, int(wait_s * 1000))}ms"
        await session.execute(
            text("SELECT set_config('lock_timeout', :timeout, true)"), {"timeout": timeout}
        )
        await session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
        yield


#: Advisory lock space (the first key of the two-key form) of jobs a live inbox batch holds
#: (``inbox_sql.HOLD``: each job id's text, hashed).
HELD_SPACE = 0x696E_6278  # "inbx"
