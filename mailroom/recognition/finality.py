"""Shared state rules: a file follows its *current* job; a mail is final when its files are.

Every status change on ``stored_file`` made by the recognition pipeline goes
through these statements, so an answer to an old attempt never moves a file
(``current_recognition_job_id`` must name the job) and every path that can end
a file (mapping, watchdog, DLQ, invalid request) also tries to end its mail.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from mailroom.db.models import FINAL_FILE_STATUSES

#: ``status_reason`` and ``error_message`` are cut to this many characters.
MAX_REASON_CHARS = 2_000

#: The job status and error code of a dead letter for a missing ack: the outbox writes it, an
#: answer that comes after all revives it (``inbox/revive.py``).
DLQ_STATUS = "dlq"
NO_ACK = "NO_ACK"


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr`` of untrusted text for logs, cut to ``limit`` characters."""
    rendered = repr(value)
    return rendered if len(rendered) <= limit else rendered[: limit - 3] + "..."


def object_metrics_sql(column: str) -> str:
    """SQL for ``column`` as a JSON object: anything else (array, scalar, NULL) counts as ``{}``."""
    return f"(CASE WHEN jsonb_typeof({column}) = 'object' THEN {column} ELSE '{{}}'::jsonb END)"


def republish_count_sql(column: str) -> str:
    """SQL for ``column -> 'republish_count'`` as an integer, 0 when absent or not a number."""
    return (
        f"(CASE WHEN jsonb_typeof({column} -> 'republish_count') = 'number' "
        f"THEN floor(({column} ->> 'republish_count')::numeric)::int ELSE 0 END)"
    )


_FAIL_CURRENT_FILES = text(
    """
    UPDATE stored_file AS f
       SET status = 'ERROR', status_reason = :reason, updated_at = :now
      FROM recognition_job AS j
     WHERE j.id = ANY(:job_ids)
       AND f.id = j.file_id
       AND f.current_recognition_job_id = j.id
    RETURNING f.mail_id
    """
)


async def fail_current_files(
    session: AsyncSession, job_ids: Sequence[uuid.UUID], *, reason: str, now: datetime
) -> set[int]:
    """Move the files whose current job is one of ``job_ids`` to ERROR; their mail ids."""
    if not job_ids:
        return set()
    result = await session.execute(
        _FAIL_CURRENT_FILES,
        {"job_ids": list(job_ids), "reason": reason[:MAX_REASON_CHARS], "now": now},
    )
    return {mail_id for (mail_id,) in result if mail_id is not None}


# Only a job still waiting for its answer is failed; a final one already has its answer or reason.
_FAIL_WAITING_JOB = text(
    """
    UPDATE recognition_job
       SET status = 'error', error_code = :code, error_message = :message, finished_at = :now,
           service_name = COALESCE(service_name, CAST(:service AS text))
     WHERE id = :id AND status IN ('queued', 'published', 'processing')
    RETURNING id
    """
)


async def fail_waiting_job(
    session: AsyncSession,
    job_id: uuid.UUID,
    *,
    code: str,
    message: str,
    now: datetime,
    service: str | None = None,
) -> list[int] | None:
    """End a job still waiting for its answer as ``error``, its file ERROR, its mail final.

    Returns the mails made final (for their notifications), or None when the job
    does not exist or is no longer waiting (it keeps its answer or its reason).
    """
    message = message[:MAX_REASON_CHARS]
    params = {"id": job_id, "code": code, "message": message, "now": now, "service": service}
    if await session.scalar(_FAIL_WAITING_JOB, params) is None:
        return None
    mail_ids = await fail_current_files(session, [job_id], reason=f"{code}: {message}", now=now)
    return await finalize_mails(session, mail_ids, now=now)


_FINAL = ", ".join(f"'{s}'" for s in FINAL_FILE_STATUSES)

# A file counts as settled when its status is final and its current job is not a result still
# waiting for mapping (mapping may yet replay it, which would move the file back to UPLOADED).
# A stored mail with no files at all (no attachments, or too large to read) is final at once.
_FINALIZE_MAILS = text(
    f"""
    UPDATE inbound_mail AS m
       SET status = 'final', finalized_at = COALESCE(CAST(:now AS timestamptz), now())
     WHERE m.id = ANY(:mail_ids)
       AND m.status = 'stored'
       AND NOT EXISTS (
            SELECT 1
              FROM stored_file AS f
              LEFT JOIN recognition_job AS j ON j.id = f.current_recognition_job_id
             WHERE f.mail_id = m.id
               AND (f.status NOT IN ({_FINAL})
                    OR (j.result_msg_id IS NOT NULL AND j.mapped_at IS NULL
                        AND j.status IN ('done', 'needs_check', 'error')))
       )
    RETURNING m.id
    """
)


async def finalize_mails(
    session: AsyncSession, mail_ids: Collection[int], *, now: datetime | None = None
) -> list[int]:
    """Mark final each of ``mail_ids`` whose files are all settled; the ids marked now.

    ``finalized_at`` is ``now``, or the database's ``now()`` when not given.

    Call after the file updates of this transaction. Two transactions settling the
    last two files of one mail would each miss the other's uncommitted change;
    locking the mail rows first makes the second wait, and its check (a new
    snapshot under READ COMMITTED) then sees the first one's committed file.
    """
    if not mail_ids:
        return []
    # Lock the mails first, in id order, so two finishers wait for each other, then re-check.
    await session.execute(
        text("SELECT id FROM inbound_mail WHERE id = ANY(:ids) ORDER BY id FOR UPDATE"),
        {"ids": sorted(mail_ids)},
    )
    result = await session.execute(_FINALIZE_MAILS, {"mail_ids": sorted(mail_ids), "now": now})
    return sorted(mail_id for (mail_id,) in result)


_REOPEN_MAIL = text(
    """
    UPDATE inbound_mail SET status = 'stored', finalized_at = NULL, notified_at = NULL
     WHERE id = :mail_id AND status = 'final'
    """
)


async def reopen_mail(session: AsyncSession, mail_id: int) -> None:
    """A final mail becomes stored again (a file of it is replayed or reviewed).

    ``finalize_mails`` can then end it anew, and its notification goes out with the new
    final state (the dedupe key carries ``finalized_at``).
    """
    await session.execute(_REOPEN_MAIL, {"mail_id": mail_id})


_SETTLED_STORED_MAILS = text(
    f"""
    SELECT m.id FROM inbound_mail AS m
     WHERE m.status = 'stored'
       AND NOT EXISTS (
            SELECT 1 FROM stored_file AS f
             WHERE f.mail_id = m.id AND f.status NOT IN ({_FINAL}))
     ORDER BY m.id
     LIMIT :limit
    """
)


async def finalize_settled_mails(
    session: AsyncSession, *, now: datetime | None = None, limit: int = 500
) -> list[int]:
    """Finalize stored mails whose files are all settled (or that have none).

    Catches mails no recognition step will ever finish: no recognizable attachment,
    or a crash between a file's last change and its mail's check.
    """
    result = await session.execute(_SETTLED_STORED_MAILS, {"limit": limit})
    return await finalize_mails(session, [mail_id for (mail_id,) in result], now=now)
