"""The deadline watchdog: jobs without a result by their reply deadline time out.

One ``UPDATE … RETURNING`` moves every ``published``/``processing`` job past its
deadline to ``timeout`` and, in the same statement, their files to ERROR when
the job is still the file's current one. The UPDATE locks each row it changes
and re-checks the status after any wait, so whoever locks a row first decides:
a result committed first leaves the job out; a result arriving after finds it
``timeout`` and is ignored as late.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.recognition.finality import finalize_mails, utcnow

logger = logging.getLogger(__name__)

#: What the file's ``status_reason`` says after a timeout.
TIMEOUT_REASON = "TIMEOUT: no result before the reply deadline"

_EXPIRE = text(
    """
    WITH expired AS (
        UPDATE recognition_job
           SET status = 'timeout', error_code = 'TIMEOUT',
               error_message = 'no result before the reply deadline', finished_at = :now
         WHERE status IN ('published', 'processing') AND reply_deadline < :now
        RETURNING id, file_id
    ), failed_files AS (
        UPDATE stored_file AS f
           SET status = 'ERROR', status_reason = :reason, updated_at = :now
          FROM expired AS e
         WHERE f.id = e.file_id AND f.current_recognition_job_id = e.id
        RETURNING f.id, f.mail_id
    )
    SELECT e.id, ff.mail_id
      FROM expired AS e
      LEFT JOIN failed_files AS ff ON ff.id = e.file_id
    """
)


@dataclass
class WatchdogPass:
    timed_out: list[uuid.UUID] = field(default_factory=list)
    finalized_mail_ids: list[int] = field(default_factory=list)


async def expire_recognition_deadlines(
    sessions: async_sessionmaker[AsyncSession], *, now: datetime | None = None
) -> WatchdogPass:
    """Time out every job past its reply deadline; its current file goes to ERROR."""
    now = now or utcnow()
    outcome = WatchdogPass()
    async with sessions() as session, session.begin():
        rows = (await session.execute(_EXPIRE, {"now": now, "reason": TIMEOUT_REASON})).all()
        outcome.timed_out = [row.id for row in rows]
        mail_ids = {row.mail_id for row in rows if row.mail_id is not None}
        outcome.finalized_mail_ids = await finalize_mails(session, mail_ids, now=now)
    for job_id in outcome.timed_out:
        logger.warning("Recognition job %s timed out (TIMEOUT)", job_id)
    return outcome
