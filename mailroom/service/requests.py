"""Requests off the wire: the contract's request, or the job a broken one still names."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from mailroom.recognition.contract.models import RecognitionRequest, parse_json_object

logger = logging.getLogger(__name__)


def parse_request(subject: str, data: bytes) -> RecognitionRequest | None:
    """The request, or ``None`` (logged without the body) when it is not the contract."""
    body: dict[str, Any] = {}
    try:
        body = parse_json_object(data)
        return RecognitionRequest.model_validate(body)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError too
        logger.warning(
            "recognizer: invalid request dropped on %s (%d bytes, job %r): %s",
            subject,
            len(data),
            str(body.get("job_id"))[:64],
            type(exc).__name__,
        )
        return None


def named_job(data: bytes) -> tuple[uuid.UUID, int, int] | None:
    """Job id, file id and attempt of a request, when it names them validly."""
    try:
        body = parse_json_object(data)
        job_id = uuid.UUID(str(body.get("job_id")))
    except ValueError:
        return None
    file_id, attempt = body.get("file_id"), body.get("attempt")
    if type(file_id) is not int or type(attempt) is not int or attempt < 1:
        return None
    return job_id, file_id, attempt
