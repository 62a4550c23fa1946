"""Inbox messages before the database: size, JSON, the contract, the message id.

Every check runs outside a transaction; a message that fails one is
``rejected`` with a warning that names the subject, size and reason, never the
body (it may carry document content).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from mailroom.adapters.storage.store import key_problem
from mailroom.errors import InvalidMessage
from mailroom.recognition.contract.models import (
    MSG_ID_HEADER,
    UNKNOWN_SERVICE,
    RecognitionResponse,
)
from mailroom.recognition.contract.rules import read_answer, service_of
from mailroom.recognition.contract.violations import FOREIGN_BUCKET, Violation
from mailroom.recognition.finality import short_repr

# The inbox's logger: operators filter one name for everything the inbox rejects or applies.
logger = logging.getLogger("mailroom.recognition.inbox.apply")

#: Longest ``Nats-Msg-Id`` we store (the column's width).
MAX_MSG_ID_CHARS = 200

Applied = Literal[
    "rejected",  # not JSON, not the contract, too large
    "unknown_job",
    "file_mismatch",
    "msg_id_mismatch",  # its Nats-Msg-Id names another attempt, job or kind: never applied
    "ack_applied",
    "ack_repeated",
    "ack_after_result",  # overtaken by its job's result: expected when both come at once
    "ack_unexpected",
    "result_applied",
    "result_duplicate",
    "result_late",
    "failed",  # its own transaction failed too (batch fallback only): apply it again later
    "attempts_exhausted",  # applying it kept killing workers: its job failed, not applied
    "contract_violation",  # off the contract but naming a waiting job: that job failed at once
]


@dataclass(frozen=True)
class InboxMessage:
    """One NATS message as the bridge forwarded it."""

    subject: str
    data: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class InboxOutcome:
    """What one message did; ``map_job_id`` is set when mapping should run."""

    applied: Applied
    job_id: uuid.UUID | None = None
    map_job_id: uuid.UUID | None = None
    #: Why a ``failed`` message failed.
    error: Exception | None = None
    #: Mails this message made final (``attempts_exhausted``): create their notifications.
    finalized_mail_ids: tuple[int, ...] = ()
    #: How a ``rejected`` message that names a job broke the contract.
    violation: Violation | None = None


def check_size(data: bytes, *, max_bytes: int) -> bool:
    return len(data) <= max_bytes


def parse_response(data: bytes) -> RecognitionResponse:
    """The contract message in ``data``; raises ``InvalidMessage`` with a loggable reason.

    The rule book's reading (``contract/rules.py``), the one the checker applies too.
    """
    return read_answer(data)


def warn_rejected(subject: str, size: int, job_id: object, reason: str) -> None:
    logger.warning(
        "Rejected recognition message on %r (%d bytes, job_id %s): %s",
        subject,
        size,
        short_repr(job_id),
        reason,
    )


def _uuid_or_none(value: object) -> uuid.UUID | None:
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def header(headers: Mapping[str, str], name: str) -> str | None:
    """The header ``name``, in any spelling; the exact one (what NATS clients send) first."""
    exact = headers.get(name)
    if exact is not None:
        return exact
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return None


@dataclass(frozen=True)
class Parsed:
    subject: str
    response: RecognitionResponse
    msg_id: str | None
    #: ``result_s3`` names an object in the configured results bucket (checked at parse); only
    #: such an object is deleted when the answer is not kept (``rules.Batch.unkept``).
    in_results_bucket: bool = False


def parse_message(
    message: InboxMessage, *, max_bytes: int, results_bucket: str | None = None
) -> Parsed | InboxOutcome:
    """The parsed message, or its ``rejected`` outcome (warned without the body).

    A result whose ``result_s3`` is outside ``results_bucket``, or whose key is unsafe
    (``key_problem``), is a contract violation: its object is never registered, so nothing
    (mapping, retention, erasure) treats a mail or an attachment another service named as a
    result object.
    """
    subject, data = message.subject, message.data
    if not check_size(data, max_bytes=max_bytes):
        logger.warning(
            "Rejected recognition message on %r: %d bytes exceeds %d", subject, len(data), max_bytes
        )
        return InboxOutcome("rejected")
    try:
        response = parse_response(data)
    except InvalidMessage as exc:
        job_id = _uuid_or_none(exc.job_id)
        if job_id is not None:
            # It names a job: the inbox fails that job if it is waiting (violations.py), or
            # warns as below if it is not.
            detail = f"{exc.reason} on {subject[:200]!r}, {len(data)} bytes"
            violation = Violation(exc.kind, detail, exc.service or UNKNOWN_SERVICE)
            return InboxOutcome("rejected", job_id, violation=violation)
        warn_rejected(subject, len(data), exc.job_id, exc.reason)
        return InboxOutcome("rejected")
    msg_id = header(message.headers, MSG_ID_HEADER)
    if msg_id is not None and len(msg_id) > MAX_MSG_ID_CHARS:
        logger.warning(
            "Rejected recognition message on %r for job %s: Nats-Msg-Id too long (%d chars)",
            subject,
            response.job_id,
            len(msg_id),
        )
        return InboxOutcome("rejected", response.job_id)
    ref = response.result_s3
    if results_bucket is not None and ref is not None and ref.bucket != results_bucket:
        detail = f"result_s3 is in bucket {ref.bucket[:100]!r}, not the results bucket"
        service = service_of({"service": {"name": response.service.name}})
        violation = Violation("foreign_bucket", detail, service, code=FOREIGN_BUCKET)
        return InboxOutcome("rejected", response.job_id, violation=violation)
    problem = key_problem(ref.key) if ref is not None else None
    if problem is not None:
        # Checked as Mailroom's own keys are: a key that escapes its bucket's folder, or that
        # Postgres cannot store (a NUL), is the service's fault, never a crash to retry.
        service = service_of({"service": {"name": response.service.name}})
        violation = Violation("unsafe_result_key", f"result_s3.key {problem}", service)
        return InboxOutcome("rejected", response.job_id, violation=violation)
    return Parsed(
        subject, response, msg_id, in_results_bucket=ref is not None and results_bucket is not None
    )
