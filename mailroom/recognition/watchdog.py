"""The deadline watchdog: jobs without a result by their reply deadline time out.

A pass works in batches, each its own short transaction: it locks up to
``batch_size`` due ``published``/``processing`` jobs (oldest deadline first,
``FOR UPDATE SKIP LOCKED``), moves them to ``timeout`` and, in the same
statement, their files to ERROR when the job is still the file's current one.
Batches keep one statement's work bounded, so a backlog after an outage never
runs into the statement timeout; the pass loops until a batch comes back short.

Whoever locks a row first decides: a result committed first leaves the job out
(the lock re-checks the status of a row changed since the snapshot); a row the
inbox holds locked right now is skipped, not waited on, and taken by the next
pass if still due; a result arriving after finds it ``timeout`` and is ignored
as late.

``TIMEOUT`` is retryable (the rule book, ``contract/rules.py``): the service took
the request, and its result was lost on the way or its replica died. A timed-out
job that is its file's current one is replayed as a new attempt in the same
transaction while ``attempt < automatic_attempts``; its file goes back to
UPLOADED instead of staying ERROR.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.db.clock import db_now
from mailroom.errors import ReplayRefused
from mailroom.recognition.contract import rules
from mailroom.recognition.finality import finalize_mails
from mailroom.recognition.replay import ReplayedJob, replay_job
from mailroom.settings import RecognitionSettings

logger = logging.getLogger(__name__)

#: What the file's ``status_reason`` says after a timeout.
TIMEOUT_REASON = "TIMEOUT: no result before the reply deadline"

_EXPIRE = text(
    """
    WITH due AS (
        SELECT id FROM recognition_job
         WHERE status IN ('published', 'processing') AND reply_deadline < :now
           AND pipeline <> ALL(CAST(:held AS text[]))
         ORDER BY reply_deadline
         LIMIT :limit
           FOR UPDATE SKIP LOCKED
    ), expired AS (
        UPDATE recognition_job AS j
           SET status = 'timeout', error_code = 'TIMEOUT',
               error_message = 'no result before the reply deadline', finished_at = :now
          FROM due
         WHERE j.id = due.id AND j.status IN ('published', 'processing')
        RETURNING j.id, j.file_id, j.attempt
    ), failed_files AS (
        UPDATE stored_file AS f
           SET status = 'ERROR', status_reason = :reason, updated_at = :now
          FROM expired AS e
         WHERE f.id = e.file_id AND f.current_recognition_job_id = e.id
        RETURNING f.id, f.mail_id
    )
    SELECT e.id, e.attempt, ff.mail_id, ff.id IS NOT NULL AS is_current
      FROM expired AS e
      LEFT JOIN failed_files AS ff ON ff.id = e.file_id
    """
)

#: Jobs one watchdog transaction times out at most when the caller names no batch size.
DEFAULT_BATCH_SIZE = 500
#: Who automatic retries of a timeout are audit-logged as.
WATCHDOG_ACTOR = ("system", "recognition.watchdog")


@dataclass
class WatchdogPass:
    timed_out: list[uuid.UUID] = field(default_factory=list)
    finalized_mail_ids: list[int] = field(default_factory=list)
    #: Timed-out jobs re-sent as a new attempt: nudge the outbox.
    replayed: list[ReplayedJob] = field(default_factory=list)


async def expire_recognition_deadlines(
    sessions: async_sessionmaker[AsyncSession],
    *,
    now: datetime | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    held: Collection[str] = (),
    automatic_attempts: int = RecognitionSettings().automatic_attempts,
) -> WatchdogPass:
    """Time out every job past its reply deadline, ``batch_size`` per transaction.

    ``held``: pipelines whose health gate is closed (gate.py); none of their jobs times out.
    ``automatic_attempts``: a timed-out attempt below it is re-sent as a new one.
    """
    outcome = WatchdogPass()
    while True:
        batch = await _expire_batch(
            sessions,
            now=now,
            limit=batch_size,
            held=sorted(held),
            automatic_attempts=automatic_attempts,
        )
        outcome.timed_out += batch.timed_out
        outcome.finalized_mail_ids += batch.finalized_mail_ids
        outcome.replayed += batch.replayed
        # NOTE: a short batch means nothing more is due that is not locked by someone else.
        if len(batch.timed_out) < batch_size:
            break
    return outcome


async def _expire_batch(
    sessions: async_sessionmaker[AsyncSession],
    *,
    now: datetime | None,
    limit: int,
    held: list[str],
    automatic_attempts: int,
) -> WatchdogPass:
    outcome = WatchdogPass()
    timeout = rules.error_class("TIMEOUT")
    async with sessions() as session, session.begin():
        now = now or await db_now(session)
        params = {"now": now, "reason": TIMEOUT_REASON, "limit": limit, "held": held}
        rows = (await session.execute(_EXPIRE, params)).all()
        outcome.timed_out = [row.id for row in rows]
        for row in rows:
            if row.is_current and rules.is_retried(
                timeout, attempt=row.attempt, automatic_attempts=automatic_attempts
            ):
                replayed = await _retry(session, row.id, now)
                if replayed is not None:
                    outcome.replayed.append(replayed)
        mail_ids = {row.mail_id for row in rows if row.mail_id is not None}
        outcome.finalized_mail_ids = await finalize_mails(session, mail_ids, now=now)
    for job_id in outcome.timed_out:
        logger.warning("Recognition job %s timed out (TIMEOUT)", job_id)
    return outcome


async def _retry(session: AsyncSession, job_id: uuid.UUID, now: datetime) -> ReplayedJob | None:
    """Re-send a timed-out job as a new attempt; None when it cannot be (its bytes are gone)."""
    actor_type, actor_id = WATCHDOG_ACTOR
    try:
        return await replay_job(
            session,
            job_id,
            actor_type=actor_type,
            actor_id=actor_id,
            reason=f"automatic retry: {TIMEOUT_REASON}",
            now=now,
            statuses=("timeout",),
        )
    except ReplayRefused as exc:
        logger.info("Timed-out job %s not retried: %s", job_id, exc)
        return None
