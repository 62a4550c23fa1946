"""What a result means: the result file read and checked, and the verdict on its file.

Nothing here writes: ``mapping.py`` decides with these and ``mapping_write.py``
writes the decisions of a batch in one transaction.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import ValidationError

from mailroom.errors import PermanentError
from mailroom.recognition.contract.models import RecognitionResult, parse_json_object
from mailroom.recognition.contract.rules import ErrorClass
from mailroom.recognition.contract.violations import (
    FOREIGN_BUCKET,
    INVALID_RESULT,
    RESULT_TOO_LARGE,
)
from mailroom.recognition.finality import MAX_REASON_CHARS
from mailroom.recognition.replay import ReplayedJob
from mailroom.settings import RecognitionSettings

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
    #: The class of the attempt's error (``rules.error_class``); None when it ended without
    #: one: RECOGNIZED, or NEEDS_CHECK, which waits for a person and is never re-sent.
    error_class: ErrorClass | None = None
    document: dict[str, Any] | None = None
    #: Set when the result file itself was unusable.
    invalid_result: Unusable | None = None


@dataclass(frozen=True)
class Decision:
    """A job's verdict and whether it is replayed (``retry``) instead of settling its file."""

    job_id: uuid.UUID
    verdict: Verdict
    retry: bool


@dataclass
class MappingOutcome:
    job_id: uuid.UUID
    applied: Literal["mapped", "already_mapped", "unknown_job", "not_a_result", "failed"]
    document_id: int | None = None
    #: The file's new status; None when the job is no longer the file's current one.
    file_status: str | None = None
    replayed: ReplayedJob | None = None
    #: The mail this mapping made final: create its notifications.
    finalized_mail_id: int | None = None
    finalized_mail_ids: list[int] = field(default_factory=list)
    #: Why a ``failed`` job could not be mapped in its batch (it is retried alone).
    error: Exception | None = None


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
        document=document,
    )
