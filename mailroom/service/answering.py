"""The answers a service gives: a result that names its document, or an error with its code."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from mailroom.recognition.contract.models import (
    RESULT_SCHEMA_VERSION,
    ObjectRef,
    RecognitionRequest,
    RecognitionResponse,
    RecognitionResult,
    ResponseError,
    ResponseMetrics,
    ServiceInfo,
)

#: A field below this confidence makes the whole result ``needs_check`` (the default).
NEEDS_CHECK_BELOW = 0.8
#: Error codes of transient failures: not remembered, a repeated request tries again.
TRANSIENT_CODES = frozenset({"STORAGE_UNAVAILABLE", "INTERNAL_ERROR"})


@dataclass(frozen=True)
class Failure:
    """What a recognizer returns when it cannot read a file: an error code of the contract."""

    code: str
    message: str
    #: True: retrying cannot help, Mailroom makes no new attempt; False: it may; None: the
    #: code's class in the contract decides.
    permanent: bool | None = None


def result_key(job_id: uuid.UUID, attempt: int) -> str:
    """Where the result document of one attempt lives in the results bucket.

    One folder for all (no folder per job): on a filesystem store each new folder is one
    more entry to create and sync before the result counts as stored.
    """
    return f"results/{job_id}.{attempt}.json"


def ack(request: RecognitionRequest, service: ServiceInfo) -> RecognitionResponse:
    return RecognitionResponse(
        job_id=request.job_id, file_id=request.file_id, status="processing", service=service
    )


def result(
    request: RecognitionRequest,
    document: RecognitionResult,
    ref: ObjectRef,
    service: ServiceInfo,
    *,
    needs_check_below: float = NEEDS_CHECK_BELOW,
) -> RecognitionResponse:
    """``done``, or ``needs_check`` when no field was found or one is below the threshold."""
    confidences = [f.confidence for f in document.fields.values()]
    low = sum(1 for c in confidences if c < needs_check_below)
    unrecognized = sum(1 for f in document.fields.values() if f.value is None)
    return RecognitionResponse(
        job_id=request.job_id,
        file_id=request.file_id,
        status="done" if confidences and not low else "needs_check",
        service=service,
        result_s3=ref,
        result_schema_version=RESULT_SCHEMA_VERSION,
        metrics=ResponseMetrics(
            fields_total=len(confidences),
            fields_low_confidence=low,
            fields_unrecognized=unrecognized,
        ),
    )


def error(
    job_id: uuid.UUID, file_id: int, failure: Failure, service: ServiceInfo
) -> RecognitionResponse:
    return RecognitionResponse(
        job_id=job_id,
        file_id=file_id,
        status="error",
        service=service,
        error=ResponseError(
            code=failure.code[:100], message=failure.message[:4000], permanent=failure.permanent
        ),
    )
