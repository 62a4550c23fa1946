"""Mapping: a result file becomes a ``document`` and settles its file (ARCHITECTURE.md).

The result JSON is read from the object store outside any transaction; the
decision is then written in one short transaction that locks the job and
re-checks ``mapped_at``, so a redelivered or swept mapping changes nothing.
A failed attempt (an ``error`` result, an unreadable result file, or a document
missing a required field or below the confidence threshold) is replayed as a
new attempt until ``automatic_attempts`` are spent; then the file settles as
ERROR or NEEDS_CHECK. Each try is counted on the job before the result is read
(``attempts.py``): a result whose mapping kills the worker settles its file as
ERROR (``MAPPING_ATTEMPTS_EXHAUSTED``) after ``max_processing_attempts``; an attempt
that comes back, however it ended, is uncounted again.
When the last file of a mail settles, the mail is final
and the outcome says so (``finalized_mail_id``): the hook for notifications.
"""

from __future__ import annotations

import json
import logging
import uuid
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.clock import db_now
from mailroom.errors import PermanentError
from mailroom.recognition import attempts
from mailroom.recognition.contracts import RecognitionResult, parse_json_object
from mailroom.recognition.finality import MAX_REASON_CHARS, finalize_mails
from mailroom.recognition.replay import ReplayedJob, replay_job
from mailroom.recognition.violations import (
    CONTRACT_ERROR_CODES,
    FOREIGN_BUCKET,
    INVALID_RESULT,
    MAX_SERVICE_CHARS,
    RESULT_TOO_LARGE,
    UNKNOWN_SERVICE,
    Violation,
    report_violation,
)
from mailroom.settings import RecognitionSettings

logger = logging.getLogger(__name__)

#: Who automatic retries are audit-logged as.
MAPPING_ACTOR = ("system", "recognition.mapping")

#: Result statuses mapping handles.
RESULT_STATUSES = ("done", "needs_check", "error")


#: Mapping of this job died (took its worker down) ``max_processing_attempts`` times.
MAPPING_ATTEMPTS_EXHAUSTED = "MAPPING_ATTEMPTS_EXHAUSTED"


class ResultReader(Protocol):
    """The part of the object store mapping needs."""

    def bucket(self, role: Literal["results"]) -> str: ...

    async def size(self, bucket: str, key: str) -> int: ...

    async def get(self, bucket: str, key: str) -> bytes: ...


@dataclass(frozen=True)
class Unusable:
    """Why a result object cannot be used: the job's error code and message."""

    code: str
    message: str


@dataclass
class Verdict:
    """What a result means for its file, before anything is written."""

    file_status: Literal["RECOGNIZED", "NEEDS_CHECK", "ERROR"]
    reason: str | None = None
    #: This attempt failed in a way a new attempt may fix.
    retryable: bool = False
    document: dict[str, Any] | None = None
    #: Set when the result file itself was unusable.
    invalid_result: Unusable | None = None


@dataclass
class MappingOutcome:
    job_id: uuid.UUID
    applied: Literal["mapped", "already_mapped", "unknown_job", "not_a_result"]
    document_id: int | None = None
    #: The file's new status; None when the job is no longer the file's current one.
    file_status: str | None = None
    replayed: ReplayedJob | None = None
    #: The mail this mapping made final: create its notifications.
    finalized_mail_id: int | None = None
    finalized_mail_ids: list[int] = field(default_factory=list)


_LOAD = text(
    """
    SELECT j.id, j.status, j.attempt, j.mapped_at, j.error_code, j.error_message,
           j.result_msg_id, j.service_name, o.bucket, o.key,
           CASE WHEN jsonb_typeof(j.metrics -> 'mapping_attempts') = 'number'
                THEN CAST(j.metrics ->> 'mapping_attempts' AS integer) ELSE 0 END AS deaths
      FROM recognition_job AS j
      LEFT JOIN stored_object AS o ON o.id = j.result_object_id
     WHERE j.id = :id
    """
)

_LOCK = text(
    """
    SELECT j.id, j.file_id, j.mapped_at, f.mail_id,
           f.current_recognition_job_id = j.id AS is_current
      FROM recognition_job AS j
      JOIN stored_file AS f ON f.id = j.file_id
     WHERE j.id = :id
       FOR UPDATE OF j
    """
)

_INSERT_DOCUMENT = text(
    """
    INSERT INTO document (file_id, job_id, document_type, fields, field_confidence,
                          missing_fields, low_confidence_fields, status, created_at)
    VALUES (:file_id, :job_id, :document_type, CAST(:fields AS jsonb),
            CAST(:field_confidence AS jsonb), CAST(:missing_fields AS jsonb),
            CAST(:low_confidence_fields AS jsonb), :status, :now)
    ON CONFLICT (job_id) DO NOTHING
    RETURNING id
    """
)

_MARK_MAPPED = text(
    """
    UPDATE recognition_job
       SET mapped_at = :now,
           status = CASE WHEN :broke_contract THEN 'error' ELSE status END,
           error_code = COALESCE(:error_code, error_code),
           error_message = COALESCE(:error_message, error_message)
     WHERE id = :id
    """
)

_SETTLE_FILE = text(
    """
    UPDATE stored_file SET status = :status, status_reason = :reason, updated_at = :now
     WHERE id = :file_id AND current_recognition_job_id = :job_id
    """
)


async def load_result(
    store: ResultReader, bucket: str | None, key: str | None, *, job_id: uuid.UUID, max_bytes: int
) -> RecognitionResult | Unusable:
    """The validated result, or why it cannot be used; storage outages propagate.

    Only the results bucket is read: the bucket comes from the service's message,
    and mapping must not become a way to read mail or other stored files. The
    size is checked before the read, so an oversize object never enters memory.
    """
    if bucket is None or key is None:
        return Unusable(INVALID_RESULT, "no result object registered")
    if bucket != store.bucket("results"):
        return Unusable(FOREIGN_BUCKET, f"result object is in bucket {bucket[:100]!r}")
    try:
        size = await store.size(bucket, key)
        if size > max_bytes:
            return Unusable(RESULT_TOO_LARGE, f"result object too large ({size} bytes)")
        data = await store.get(bucket, key)
    except PermanentError as exc:  # not found, unsafe key
        return Unusable(INVALID_RESULT, f"result object unreadable: {type(exc).__name__}")
    if len(data) > max_bytes:  # replaced between the size check and the read
        return Unusable(RESULT_TOO_LARGE, f"result object too large ({len(data)} bytes)")
    try:
        result = RecognitionResult.model_validate(parse_json_object(data))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        if isinstance(exc, ValidationError):
            fields = sorted({str(e["loc"][0]) for e in exc.errors() if e["loc"]})[:5]
            return Unusable(INVALID_RESULT, f"result is not the contract ({', '.join(fields)})")
        return Unusable(INVALID_RESULT, "result is not a JSON object")
    if result.job_id != job_id:
        return Unusable(INVALID_RESULT, "result names another job")
    return result


def judge(
    result: RecognitionResult, *, service_status: str, settings: RecognitionSettings
) -> Verdict:
    """Check a valid result against its document type's required fields and the threshold."""
    doc_type = settings.document_types.get(result.document_type)
    values = {name: value.value for name, value in result.fields.items()}
    # A one-of rule not met is reported as "investor_name|customer_id".
    missing = doc_type.missing(values) if doc_type else []
    low = sorted(
        name
        for name, value in result.fields.items()
        if value.confidence < settings.confidence_threshold
    )
    reasons = []
    if service_status == "needs_check":
        reasons.append("the service asked for a check")
    if doc_type is None:
        reasons.append(f"unknown document type {result.document_type[:100]!r}")
    if missing:
        reasons.append(f"missing required fields: {', '.join(missing)}")
    if low:
        reasons.append(f"low confidence: {', '.join(low[:20])}")
    ok = not reasons
    document = {
        "document_type": result.document_type,
        "fields": values,
        "field_confidence": {name: value.confidence for name, value in result.fields.items()},
        "missing_fields": missing,
        "low_confidence_fields": low,
        "status": "ok" if ok else "needs_check",
    }
    return Verdict(
        file_status="RECOGNIZED" if ok else "NEEDS_CHECK",
        reason=None if ok else "; ".join(reasons)[:MAX_REASON_CHARS],
        retryable=bool(missing or low),
        document=document,
    )


async def map_recognition_result(
    sessions: async_sessionmaker[AsyncSession],
    store: ResultReader,
    job_id: uuid.UUID,
    *,
    settings: RecognitionSettings,
    now: datetime | None = None,
) -> MappingOutcome:
    """Map one job's result; idempotent (a mapped job is left alone)."""
    async with sessions() as session:
        job = (await session.execute(_LOAD, {"id": job_id})).one_or_none()
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

    # An earlier attempt died: run alone, and wait for the turn before counting, so that a
    # neighbour's death (a poison result redelivered with this one) is not counted here.
    turn = attempts.alone(sessions, attempts.ALONE_KEY) if job.deaths > 0 else nullcontext()
    async with turn:
        return await _counted(sessions, store, job, job_id, settings=settings, now=now)


async def _counted(
    sessions: async_sessionmaker[AsyncSession],
    store: ResultReader,
    job: Any,
    job_id: uuid.UUID,
    *,
    settings: RecognitionSettings,
    now: datetime | None,
) -> MappingOutcome:
    """Count the attempt, then map (or settle the job as exhausted); give the attempt back."""
    tries = (await attempts.count_attempts(sessions, [job_id], attempts.MAPPING_ATTEMPTS))[job_id]
    try:
        if tries > settings.max_processing_attempts:
            # Not replayed: a new attempt would likely bring the result that killed its workers.
            exhausted = Unusable(
                MAPPING_ATTEMPTS_EXHAUSTED, f"mapping did not finish in {tries - 1} attempts"
            )
            logger.error("Result of job %s: %s", job_id, exhausted.message)
            verdict = Verdict(
                "ERROR", reason=f"{exhausted.code}: {exhausted.message}", invalid_result=exhausted
            )
            return await _write(sessions, job_id, verdict, retry=False, now=now)
        return await _map(sessions, store, job, job_id, settings=settings, now=now)
    finally:
        # However it ended, this attempt came back: only attempts that died stay counted.
        await attempts.give_back(sessions, [job_id], attempts.MAPPING_ATTEMPTS)


async def _map(
    sessions: async_sessionmaker[AsyncSession],
    store: ResultReader,
    job: Any,
    job_id: uuid.UUID,
    *,
    settings: RecognitionSettings,
    now: datetime | None,
) -> MappingOutcome:
    if job.status == "error":
        reason = f"{job.error_code or 'SERVICE_ERROR'}: {job.error_message or ''}"
        verdict = Verdict("ERROR", reason=reason[:MAX_REASON_CHARS], retryable=True)
    else:
        loaded = await load_result(
            store, job.bucket, job.key, job_id=job_id, max_bytes=settings.max_result_bytes
        )
        if isinstance(loaded, Unusable):
            service = (job.service_name or UNKNOWN_SERVICE)[:MAX_SERVICE_CHARS]
            violation = Violation(loaded.code.lower(), loaded.message, service)
            report_violation(violation, job_id=job_id, where="result document")
            verdict = Verdict(
                "ERROR",
                reason=f"{loaded.code}: {loaded.message}"[:MAX_REASON_CHARS],
                retryable=True,
                invalid_result=loaded,
            )
        else:
            verdict = judge(loaded, service_status=job.status, settings=settings)
    retry = verdict.retryable and job.attempt < settings.automatic_attempts
    return await _write(sessions, job_id, verdict, retry=retry, now=now)


async def _write(
    sessions: async_sessionmaker[AsyncSession],
    job_id: uuid.UUID,
    verdict: Verdict,
    *,
    retry: bool,
    now: datetime | None,
) -> MappingOutcome:
    async with sessions() as session, session.begin():
        now = now or await db_now(session)
        row = (await session.execute(_LOCK, {"id": job_id})).one()
        if row.mapped_at is not None:  # a parallel mapping of the same job won
            return MappingOutcome(job_id, "already_mapped")
        outcome = MappingOutcome(job_id, "mapped")
        if verdict.document is not None:
            outcome.document_id = await _insert_document(
                session, row.file_id, job_id, verdict.document, now
            )
        await session.execute(
            _MARK_MAPPED,
            {
                "id": job_id,
                "now": now,
                "error_code": verdict.invalid_result.code if verdict.invalid_result else None,
                "error_message": verdict.invalid_result.message if verdict.invalid_result else None,
                # The service's document broke the contract: the job failed, as in the inbox.
                # (Mapping's own failure, MAPPING_ATTEMPTS_EXHAUSTED, keeps the service's status.)
                "broke_contract": bool(
                    verdict.invalid_result and verdict.invalid_result.code in CONTRACT_ERROR_CODES
                ),
            },
        )
        if not row.is_current:
            logger.info("Result of job %s mapped; the file has a newer attempt", job_id)
            return outcome
        if retry:
            actor_type, actor_id = MAPPING_ACTOR
            outcome.replayed = await replay_job(
                session,
                job_id,
                actor_type=actor_type,
                actor_id=actor_id,
                reason=f"automatic retry: {verdict.reason}",
                now=now,
                statuses=RESULT_STATUSES,
            )
            outcome.file_status = "UPLOADED"
        else:
            await session.execute(
                _SETTLE_FILE,
                {
                    "status": verdict.file_status,
                    "reason": verdict.reason,
                    "now": now,
                    "file_id": row.file_id,
                    "job_id": job_id,
                },
            )
            outcome.file_status = verdict.file_status
            if row.mail_id is not None:
                outcome.finalized_mail_ids = await finalize_mails(session, [row.mail_id], now=now)
                outcome.finalized_mail_id = next(iter(outcome.finalized_mail_ids), None)
    logger.info(
        "Result of job %s mapped: file %s%s%s",
        job_id,
        outcome.file_status,
        f", retried as {outcome.replayed.new_job_id}" if outcome.replayed else "",
        f", mail {outcome.finalized_mail_id} final" if outcome.finalized_mail_id else "",
    )
    return outcome


async def _insert_document(
    session: AsyncSession, file_id: int, job_id: uuid.UUID, document: dict[str, Any], now: datetime
) -> int:
    params = {
        "file_id": file_id,
        "job_id": job_id,
        "now": now,
        "document_type": document["document_type"],
        "status": document["status"],
        **{
            name: json.dumps(document[name])
            for name in ("fields", "field_confidence", "missing_fields", "low_confidence_fields")
        },
    }
    inserted = (await session.execute(_INSERT_DOCUMENT, params)).scalar_one_or_none()
    if inserted is not None:
        return int(inserted)
    existing = await session.execute(
        text("SELECT id FROM document WHERE job_id = :job_id"), {"job_id": job_id}
    )
    return int(existing.scalar_one())


_UNMAPPED = text(
    """
    SELECT id FROM recognition_job
     WHERE status IN ('done', 'needs_check', 'error')
       AND mapped_at IS NULL
       AND result_msg_id IS NOT NULL
       AND finished_at < :before
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
    async with sessions() as session:
        before = (now or await db_now(session)) - timedelta(seconds=settings.unmapped_after_s)
        rows = await session.execute(
            _UNMAPPED, {"before": before, "limit": settings.sweep_batch_size}
        )
        return [job_id for (job_id,) in rows]
