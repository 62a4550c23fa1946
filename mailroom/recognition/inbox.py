"""The inbox: acks and results from recognition services (DESIGN.md §5).

``apply_recognition_message`` parses outside the database, then runs one short
transaction with no network I/O. ``SELECT … FOR UPDATE`` on the job waits for
whoever holds it (the publisher mid-batch, the watchdog), so the first to lock
the row decides and the others see its outcome. The handler is idempotent: a
redelivered message finds its effect already there and changes nothing.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.models import FINAL_JOB_STATUSES
from mailroom.recognition.contracts import (
    MSG_ID_HEADER,
    RecognitionResponse,
    ack_msg_id,
    parse_json_object,
    result_msg_id,
)
from mailroom.recognition.finality import MAX_REASON_CHARS, short_repr, utcnow

logger = logging.getLogger(__name__)

#: Longest ``Nats-Msg-Id`` we store (the column's width).
MAX_MSG_ID_CHARS = 200

Applied = Literal[
    "rejected",  # not JSON, not the contract, too large
    "unknown_job",
    "file_mismatch",
    "ack_applied",
    "ack_repeated",
    "ack_unexpected",
    "result_applied",
    "result_duplicate",
    "result_late",
]


@dataclass(frozen=True)
class InboxOutcome:
    """What one message did; ``map_job_id`` is set when mapping should run."""

    applied: Applied
    job_id: uuid.UUID | None = None
    map_job_id: uuid.UUID | None = None


class InvalidMessage(ValueError):
    """The body is not a contract message (never retried)."""


def check_size(data: bytes, *, max_bytes: int) -> bool:
    return len(data) <= max_bytes


def parse_response(data: bytes) -> RecognitionResponse:
    """The contract message in ``data``; raises ``InvalidMessage`` with a loggable reason."""
    try:
        body = parse_json_object(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidMessage("not a JSON object", None) from exc
    job_id = body.get("job_id")
    try:
        response = RecognitionResponse.model_validate(body)
    except ValidationError as exc:
        fields = sorted({str(e["loc"][0]) for e in exc.errors() if e["loc"]})[:5]
        raise InvalidMessage(f"not the contract ({', '.join(fields)})", job_id) from exc
    if response.status in ("done", "needs_check") and response.result_s3 is None:
        raise InvalidMessage(f"{response.status} without result_s3", job_id)
    return response


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return None


_LOCK_JOB = text(
    """
    SELECT j.id, j.file_id, j.status, j.attempt, j.result_msg_id, j.metrics,
           f.current_recognition_job_id = j.id AS is_current
      FROM recognition_job AS j
      JOIN stored_file AS f ON f.id = j.file_id
     WHERE j.id = :id
       FOR UPDATE OF j
    """
)

# Each answer is written in one statement (the job, its result object, its current file), so
# the transaction is three round trips: lock, write, commit.
_APPLY_ACK = text(
    """
    WITH job AS (
        UPDATE recognition_job
           SET status = 'processing', started_at = :now,
               service_name = :service_name, service_version = :service_version
         WHERE id = :id
        RETURNING id, file_id
    )
    UPDATE stored_file AS f SET status = 'PROCESSING', updated_at = :now
      FROM job
     WHERE f.id = job.file_id AND f.current_recognition_job_id = job.id AND f.status = 'UPLOADED'
    """
)

_APPLY_RESULT = text(
    """
    WITH registered AS (
        INSERT INTO stored_object (bucket_role, bucket, key, created_by)
        SELECT 'results', CAST(:bucket AS text), CAST(:key AS text), :created_by
         WHERE CAST(:bucket AS text) IS NOT NULL
        ON CONFLICT (bucket, key) DO NOTHING
        RETURNING id
    ), result_object AS (
        SELECT id FROM registered
        UNION ALL
        SELECT id FROM stored_object WHERE bucket = :bucket AND key = :key
        LIMIT 1
    ), job AS (
        UPDATE recognition_job
           SET status = :status, finished_at = :now,
               service_name = :service_name, service_version = :service_version,
               metrics = CAST(:metrics AS jsonb),
               fields_total = :fields_total,
               fields_low_confidence = :fields_low_confidence,
               fields_unrecognized = :fields_unrecognized,
               error_code = :error_code, error_message = :error_message,
               result_schema_version = :result_schema_version,
               result_object_id = (SELECT id FROM result_object),
               result_msg_id = :msg_id
         WHERE id = :id
        RETURNING id, file_id
    ), file AS (
        UPDATE stored_file AS f
           SET status = CASE WHEN :status = 'error' THEN 'ERROR' ELSE 'PROCESSING' END,
               status_reason = CASE WHEN :status = 'error' THEN :reason ELSE f.status_reason END,
               updated_at = :now
          FROM job
         WHERE f.id = job.file_id AND f.current_recognition_job_id = job.id
           AND (:status = 'error' OR f.status = 'UPLOADED')
        RETURNING f.id
    )
    SELECT (SELECT id FROM result_object) AS result_object_id
    """
)

# A result object registered by a transaction that committed after our statement's snapshot
# is invisible to it (ON CONFLICT did nothing, the SELECT saw nothing): link it in a new one.
_LINK_RESULT_OBJECT = text(
    """
    UPDATE recognition_job
       SET result_object_id = (SELECT id FROM stored_object WHERE bucket = :bucket AND key = :key)
     WHERE id = :id
    """
)


async def apply_recognition_message(
    sessions: async_sessionmaker[AsyncSession],
    *,
    subject: str,
    data: bytes,
    headers: Mapping[str, str],
    max_bytes: int,
    now: datetime | None = None,
) -> InboxOutcome:
    """Apply one ack or result; database errors propagate (the caller retries)."""
    if not check_size(data, max_bytes=max_bytes):
        logger.warning(
            "Rejected recognition message on %r: %d bytes exceeds %d", subject, len(data), max_bytes
        )
        return InboxOutcome("rejected")
    try:
        response = parse_response(data)
    except InvalidMessage as exc:
        reason, job_id = exc.args
        logger.warning(
            "Rejected recognition message on %r (%d bytes, job_id %s): %s",
            subject,
            len(data),
            short_repr(job_id),
            reason,
        )
        return InboxOutcome("rejected")
    msg_id = _header(headers, MSG_ID_HEADER)
    if msg_id is not None and len(msg_id) > MAX_MSG_ID_CHARS:
        logger.warning(
            "Rejected recognition message on %r for job %s: Nats-Msg-Id too long (%d chars)",
            subject,
            response.job_id,
            len(msg_id),
        )
        return InboxOutcome("rejected", response.job_id)

    async with sessions() as session, session.begin():
        job = (await session.execute(_LOCK_JOB, {"id": response.job_id})).one_or_none()
        if job is None:
            logger.warning("Recognition message on %r for unknown job %s", subject, response.job_id)
            return InboxOutcome("unknown_job", response.job_id)
        if job.file_id != response.file_id:
            logger.warning(
                "Recognition message for job %s names file %d, the job's file is %d; ignored",
                job.id,
                response.file_id,
                job.file_id,
            )
            return InboxOutcome("file_mismatch", job.id)
        if msg_id is None:
            derive = ack_msg_id if response.is_ack else result_msg_id
            msg_id = derive(job.id, job.attempt)
            logger.warning(
                "Recognition message for job %s has no Nats-Msg-Id; using %s", job.id, msg_id
            )
        if response.is_ack:
            return await _apply_ack(session, job, response, now or utcnow())
        return await _apply_result(session, job, response, msg_id, now or utcnow())


async def _apply_ack(
    session: AsyncSession, job: Any, response: RecognitionResponse, now: datetime
) -> InboxOutcome:
    if job.status == "processing":
        logger.debug("Repeated ack for job %s ignored", job.id)
        return InboxOutcome("ack_repeated", job.id)
    if job.status != "published":
        logger.warning("Ack for job %s in status %s ignored", job.id, job.status)
        return InboxOutcome("ack_unexpected", job.id)
    await session.execute(
        _APPLY_ACK,
        {
            "id": job.id,
            "now": now,
            "service_name": response.service.name,
            "service_version": response.service.version,
        },
    )
    logger.info("Recognition job %s acked by %s", job.id, short_repr(response.service.name))
    return InboxOutcome("ack_applied", job.id)


async def _apply_result(
    session: AsyncSession, job: Any, response: RecognitionResponse, msg_id: str, now: datetime
) -> InboxOutcome:
    if job.result_msg_id == msg_id:
        logger.debug("Duplicate result %s for job %s ignored", msg_id, job.id)
        return InboxOutcome("result_duplicate", job.id)
    if job.status in FINAL_JOB_STATUSES:
        logger.warning("Late result for job %s ignored: the job is already %s", job.id, job.status)
        return InboxOutcome("result_late", job.id)

    theirs = response.metrics.model_dump(exclude_none=True) if response.metrics else {}
    ours = job.metrics if isinstance(job.metrics, dict) else {}
    error = response.error
    error_code = (error.code if error else "SERVICE_ERROR") if response.status == "error" else None
    error_message = (error.message[:MAX_REASON_CHARS] if error else None) if error_code else None
    result_s3 = response.result_s3
    params = {
        "id": job.id,
        "status": response.status,
        "now": now,
        "service_name": response.service.name,
        "service_version": response.service.version,
        "metrics": json.dumps({**ours, **theirs}, default=str),
        "fields_total": theirs.get("fields_total"),
        "fields_low_confidence": theirs.get("fields_low_confidence"),
        "fields_unrecognized": theirs.get("fields_unrecognized"),
        "error_code": error_code,
        "error_message": error_message,
        "result_schema_version": response.result_schema_version,
        "msg_id": msg_id,
        "bucket": result_s3.bucket if result_s3 else None,
        "key": result_s3.key if result_s3 else None,
        "created_by": f"recognition:{response.service.name}"[:100],
        "reason": f"{error_code}: {error_message or ''}"[:MAX_REASON_CHARS],
    }
    linked = (await session.execute(_APPLY_RESULT, params)).scalar_one_or_none()
    if result_s3 is not None and linked is None:
        await session.execute(_LINK_RESULT_OBJECT, params)
    logger.info("Recognition job %s result applied: %s", job.id, response.status)
    return InboxOutcome("result_applied", job.id, map_job_id=job.id)
