"""The inbox's bounded attempts: a message that kills its worker ends its job, not the inbox.

A batch writes one ``inbox_batch_attempt`` row naming its jobs before it is applied,
committed, and deletes it when it ends (in its own transaction when it commits). A
batch that finds another batch's row naming one of its jobs, i.e. an earlier batch
holding one of its jobs died, is applied
one message at a time, each counted on its own job (``inbox_attempts``): the
message that kills the worker then charges only its own job, which after
``max_processing_attempts`` such deaths fails with
``INBOX_ATTEMPTS_EXHAUSTED`` (file ERROR, its mail finalized and named in the
outcome for notification, as mapping does) while the other messages of the batch
are applied. Every attempt that comes back is uncounted, however it ended; once all
of a batch's messages went one by one and came back, the dead batches' rows let go of
its jobs (``SETTLE_DEAD_BATCHES``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.db.clock import db_now
from mailroom.db.engine import autocommit
from mailroom.recognition import attempts
from mailroom.recognition.finality import fail_waiting_job
from mailroom.recognition.inbox.messages import InboxOutcome, Parsed

logger = logging.getLogger("mailroom.recognition.inbox.apply")

#: Job ``error_code`` (and file reason) of a job whose messages kept killing the inbox.
INBOX_ATTEMPTS_EXHAUSTED = "INBOX_ATTEMPTS_EXHAUSTED"

ApplyOne = Callable[[Parsed], Awaitable[list[InboxOutcome]]]

# The batch's row, committed before the work, and the rows of other batches that name one of
# its jobs. The batch holds its jobs (``inbox_sql.HOLD``), and a live batch deletes its row before
# it lets go of them: every row that comes back is a batch that never ended, i.e. died. Its own
# statement, after the hold's: a statement's snapshot is taken before it waits for locks. One
# row per batch, so the jobs are written once per batch (by the write-back), not twice.
BEGIN_BATCH = text(
    """
    WITH mine AS (
        INSERT INTO inbox_batch_attempt (id, job_ids) VALUES (:id, CAST(:ids AS uuid[]))
    )
    SELECT DISTINCT b.id
      FROM inbox_batch_attempt AS b, unnest(b.job_ids) AS job_id
     WHERE job_id = ANY(CAST(:ids AS uuid[]))
    """
)

#: The batch's row gone: in its write-back's transaction, or apart when the batch failed.
END_BATCH = text("DELETE FROM inbox_batch_attempt WHERE id = :id")

# Dead batches' rows let go of jobs whose messages all went one by one and came back: those
# jobs are no longer suspects, so their next batch goes the batch way again (a row naming
# them for good sent every later batch holding one of them one by one). Run while the jobs
# are held, so every row naming one of them is a dead batch's. A row left with no job goes.
SETTLE_DEAD_BATCHES = (
    text("DELETE FROM inbox_batch_attempt WHERE job_ids <@ CAST(:ids AS uuid[])"),
    text(
        """
        UPDATE inbox_batch_attempt
           SET job_ids = ARRAY(SELECT j FROM unnest(job_ids) AS j
                                WHERE j <> ALL(CAST(:ids AS uuid[])))
         WHERE job_ids && CAST(:ids AS uuid[])
        """
    ),
)


async def begin_batch(
    sessions: async_sessionmaker[AsyncSession], attempt_id: uuid.UUID, ids: str
) -> bool:
    """Record the batch's attempt at its jobs (``ids``, a ``uuid[]`` literal), committed.

    True when an earlier batch holding one of them died. One statement in autocommit.
    """
    async with autocommit(sessions) as connection:
        dead = await connection.execute(BEGIN_BATCH, {"id": attempt_id, "ids": ids})
        return dead.first() is not None


async def end_batch_apart(
    sessions: async_sessionmaker[AsyncSession], attempt_id: uuid.UUID
) -> None:
    """Delete the batch's row on its own; best effort, an error of the batch wins."""
    try:
        async with autocommit(sessions) as connection:
            await connection.execute(END_BATCH, {"id": attempt_id})
    except Exception:  # the database may be why the batch failed: the row then stays
        logger.warning("Could not end inbox batch attempt %s", attempt_id, exc_info=True)


async def fail_exhausted(
    sessions: async_sessionmaker[AsyncSession],
    job_id: uuid.UUID,
    tries: int,
    now: datetime | None = None,
) -> list[int]:
    """Fail the job, its file (if current) and finalize its mail; the mails made final."""
    message = f"applying its messages did not finish in {tries - 1} attempts"
    async with sessions() as session, session.begin():
        now = now or await db_now(session)
        finalized = await fail_waiting_job(
            session, job_id, code=INBOX_ATTEMPTS_EXHAUSTED, message=message, now=now
        )
        if finalized is None:
            return []
    logger.error("Recognition job %s failed: %s", job_id, message)
    return finalized


async def apply_counted(
    sessions: async_sessionmaker[AsyncSession],
    message: Parsed,
    apply_one: ApplyOne,
    *,
    max_attempts: int,
    now: datetime | None,
) -> list[InboxOutcome]:
    """One message counted on its own job, then applied, or its job failed past the maximum."""
    # Only a batch's death leads here, so every message is a suspect: each runs alone, and
    # waits for its turn before it is counted, so no neighbour's death is counted on its job.
    async with attempts.alone(sessions, attempts.ALONE_KEY):
        return await _counted(sessions, message, apply_one, max_attempts=max_attempts, now=now)


async def _counted(
    sessions: async_sessionmaker[AsyncSession],
    message: Parsed,
    apply_one: ApplyOne,
    *,
    max_attempts: int,
    now: datetime | None,
) -> list[InboxOutcome]:
    job_id = message.response.job_id
    counts = await attempts.count_attempts(sessions, [job_id], attempts.INBOX_ATTEMPTS)
    tries = counts.get(job_id, 0)
    try:
        if tries > max_attempts:
            finalized = await fail_exhausted(sessions, job_id, tries, now)
            return [InboxOutcome("attempts_exhausted", job_id, finalized_mail_ids=tuple(finalized))]
        return await apply_one(message)
    finally:
        await attempts.give_back(sessions, counts, attempts.INBOX_ATTEMPTS)
