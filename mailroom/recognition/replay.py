"""Replay: a failed attempt (dlq / timeout / error) gets a new job row (ARCHITECTURE.md).

The old row stays as the record of its attempt; the new one (``attempt + 1``,
fresh msg ids, ``queued``) becomes the file's current job and the file goes back
to UPLOADED, so a late answer to the old attempt no longer touches the file. A
final mail is reopened, so it is finalized (and notified) again once the new
attempt settles. Every replay writes one ``recognition.replayed`` audit event.
Callers nudge the outbox publisher with what was created.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from mailroom.db.audit import add_audit_event
from mailroom.db.clock import db_now
from mailroom.errors import ReplayRefused
from mailroom.recognition.contract.models import request_msg_id
from mailroom.recognition.finality import MAX_REASON_CHARS, reopen_mail

logger = logging.getLogger(__name__)

#: Job statuses a replay may start from.
REPLAYABLE = ("dlq", "timeout", "error")

AUDIT_ACTION = "recognition.replayed"


@dataclass(frozen=True)
class ReplayedJob:
    """One replay: the attempt that failed and the queued job that replaces it."""

    old_job_id: uuid.UUID
    new_job_id: uuid.UUID
    file_id: int
    attempt: int
    previous_status: str


_LOCK_ONE = text(
    """
    SELECT j.id, j.file_id, j.pipeline, j.status, j.attempt, j.error_code,
           f.current_recognition_job_id = j.id AS is_current, f.mail_id,
           f.object_id IS NULL AS no_object
      FROM recognition_job AS j
      JOIN stored_file AS f ON f.id = j.file_id
     WHERE j.id = :id
       FOR UPDATE OF j, f
    """
)

_LOCK_BY_STATUS = text(
    """
    SELECT j.id, j.file_id, j.pipeline, j.status, j.attempt, j.error_code,
           TRUE AS is_current, f.mail_id
      FROM recognition_job AS j
      JOIN stored_file AS f ON f.id = j.file_id AND f.current_recognition_job_id = j.id
     WHERE j.status = :status
       -- A file whose bytes retention removed (or never stored) has nothing to recognize.
       AND f.object_id IS NOT NULL
     ORDER BY j.finished_at NULLS FIRST, j.id
     LIMIT :limit
       FOR UPDATE OF j, f SKIP LOCKED
    """
)

_INSERT_JOB = text(
    """
    INSERT INTO recognition_job (id, file_id, pipeline, status, attempt, request_msg_id,
                                 requested_at, metrics)
    VALUES (:id, :file_id, :pipeline, 'queued', :attempt, :msg_id, :now,
            jsonb_build_object('replay_of', CAST(:old_id AS text)))
    """
)

_POINT_FILE = text(
    """
    UPDATE stored_file
       SET current_recognition_job_id = :job_id, status = 'UPLOADED', status_reason = NULL,
           updated_at = :now
     WHERE id = :file_id
    """
)


async def replay_job(
    session: AsyncSession,
    job_id: uuid.UUID,
    *,
    actor_type: str,
    actor_id: str,
    reason: str | None = None,
    now: datetime | None = None,
    statuses: tuple[str, ...] = REPLAYABLE,
) -> ReplayedJob:
    """Replay one job in the caller's transaction; ``ReplayRefused`` says why not.

    ``statuses`` widens what may replay: mapping retries a ``done`` job whose
    document failed the required-field or confidence check.
    """
    row = (await session.execute(_LOCK_ONE, {"id": job_id})).one_or_none()
    if row is None:
        raise ReplayRefused(f"recognition job {job_id} does not exist")
    if row.status not in statuses:
        raise ReplayRefused(f"recognition job {job_id} is {row.status}; only {statuses} replay")
    if not row.is_current:
        raise ReplayRefused(f"recognition job {job_id} is not its file's current attempt")
    if row.no_object:
        raise ReplayRefused(
            f"recognition job {job_id}: its file's bytes are gone (removed by retention)"
        )
    return await _replay(
        session,
        row,
        actor_type=actor_type,
        actor_id=actor_id,
        reason=reason,
        now=now or await db_now(session),
    )


async def replay_jobs_by_status(
    session: AsyncSession,
    status: str,
    *,
    limit: int,
    actor_type: str,
    actor_id: str,
    reason: str | None = None,
    now: datetime | None = None,
) -> list[ReplayedJob]:
    """Replay up to ``limit`` current jobs in ``status`` (oldest first), in the caller's transaction."""
    if status not in REPLAYABLE:
        raise ReplayRefused(f"status {status!r} cannot be replayed; choose one of {REPLAYABLE}")
    now = now or await db_now(session)
    rows = (await session.execute(_LOCK_BY_STATUS, {"status": status, "limit": limit})).all()
    return [
        await _replay(
            session, row, actor_type=actor_type, actor_id=actor_id, reason=reason, now=now
        )
        for row in rows
    ]


async def _replay(
    session: AsyncSession,
    row: Any,
    *,
    actor_type: str,
    actor_id: str,
    reason: str | None,
    now: datetime,
) -> ReplayedJob:
    attempt = (
        await session.execute(
            text("SELECT max(attempt) FROM recognition_job WHERE file_id = :file_id"),
            {"file_id": row.file_id},
        )
    ).scalar_one() + 1
    new_id = uuid.uuid4()
    await session.execute(
        _INSERT_JOB,
        {
            "id": new_id,
            "file_id": row.file_id,
            "pipeline": row.pipeline,
            "attempt": attempt,
            "msg_id": request_msg_id(new_id, attempt),
            "now": now,
            "old_id": str(row.id),
        },
    )
    await session.execute(_POINT_FILE, {"job_id": new_id, "file_id": row.file_id, "now": now})
    if row.mail_id is not None:
        await reopen_mail(session, row.mail_id)
    detail = {
        "new_job_id": str(new_id),
        "file_id": row.file_id,
        "attempt": attempt,
        "previous_status": row.status,
        "previous_error_code": row.error_code,
        "reason": (reason or "")[:MAX_REASON_CHARS],
    }
    add_audit_event(
        session,
        actor_type=actor_type[:50],
        actor_id=actor_id[:200],
        action=AUDIT_ACTION,
        target=f"recognition_job:{row.id}",
        detail=detail,
    )
    logger.info(
        "Recognition job %s (%s) replayed as %s, attempt %d, by %s:%s",
        row.id,
        row.status,
        new_id,
        attempt,
        actor_type,
        actor_id,
    )
    return ReplayedJob(
        old_job_id=row.id,
        new_job_id=new_id,
        file_id=row.file_id,
        attempt=attempt,
        previous_status=row.status,
    )
