"""The inbox's bounded attempts: a message that kills its worker ends its job, not the inbox.

A batch counts an attempt on each of its jobs before it is applied (``attempts.py``,
``inbox_batch_attempts``) and gives them back when it ends. A batch that finds a
count left over, i.e. an earlier batch holding one of its jobs died, is applied
one message at a time, each counted on its own job (``inbox_attempts``): the
message that kills the worker then charges only its own job, which after
``max_processing_attempts`` such deaths fails with
``INBOX_ATTEMPTS_EXHAUSTED`` (file ERROR, its mail finalized and named in the
outcome for notification, as mapping does) while the other messages of the batch
are applied. Every attempt that comes back is uncounted, however it ended.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.clock import db_now
from mailroom.recognition import attempts
from mailroom.recognition.finality import fail_waiting_job
from mailroom.recognition.inbox_messages import InboxOutcome, Parsed

logger = logging.getLogger("mailroom.recognition.inbox")

#: Job ``error_code`` (and file reason) of a job whose messages kept killing the inbox.
INBOX_ATTEMPTS_EXHAUSTED = "INBOX_ATTEMPTS_EXHAUSTED"

ApplyOne = Callable[[Parsed], Awaitable[list[InboxOutcome]]]


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
