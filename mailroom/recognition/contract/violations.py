"""Answers that break the recognition contract: the job fails at once, and people hear of it.

A recognition service written by another team may misread the contract. When
its message or result document names a job we know but breaks the contract,
waiting for the reply deadline would hide the fault for minutes and then call
it a timeout. Instead the job ends at once as ``error``/``INVALID_RESULT`` with
the reason (its file ERROR, its mail final and notified), and the fault is
reported: a WARNING line (never the body), a counter by service and reason, and
at most one Sentry event per service and reason within ``SENTRY_WINDOW_S`` (a
service that breaks every message must not flood on-call).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass

from prometheus_client import Counter
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.db.clock import db_now
from mailroom.process.observability import active_sentry
from mailroom.recognition.contract.models import UNKNOWN_SERVICE
from mailroom.recognition.finality import fail_waiting_job, short_repr

logger = logging.getLogger("mailroom.recognition.inbox.apply")

#: Job ``error_code`` of an answer or a result document off the contract.
INVALID_RESULT = "INVALID_RESULT"
#: Job ``error_code`` of a result document outside the results bucket, or too large to read.
FOREIGN_BUCKET = "RESULT_FOREIGN_BUCKET"
RESULT_TOO_LARGE = "RESULT_TOO_LARGE"
#: Every code a job ends with because its service broke the contract.
CONTRACT_ERROR_CODES = (INVALID_RESULT, FOREIGN_BUCKET, RESULT_TOO_LARGE)

#: At most one Sentry event per (service, reason) within this many seconds.
SENTRY_WINDOW_S = 600.0


CONTRACT_VIOLATIONS = Counter(
    "mailroom_recognition_contract_violations_total",
    "Recognition answers and result documents that broke the contract.",
    ["service", "reason"],
)


@dataclass(frozen=True)
class Violation:
    """How a message or result document broke the contract, fit for logs and labels."""

    #: A short fixed category: ``not_json``, ``not_contract``, ``missing_result_s3``, …
    reason: str
    #: What exactly, without the body (field names, sizes).
    detail: str
    service: str = UNKNOWN_SERVICE
    #: The job's ``error_code`` when this violation fails it.
    code: str = INVALID_RESULT


class _Window:
    """Remembers when each key was last reported (per process)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._last: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def due(self, key: tuple[str, str]) -> bool:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.window_s:
                return False
            self._last[key] = now
            return True


_sentry_window = _Window(SENTRY_WINDOW_S)


def report_violation(violation: Violation, *, job_id: uuid.UUID | str | None, where: str) -> None:
    """WARNING line, counter, and a Sentry event once per service and reason per window."""
    logger.warning(
        "Recognition %s from service %s broke the contract (job %s): %s: %s",
        where,
        short_repr(violation.service),
        short_repr(str(job_id) if job_id is not None else None),
        violation.reason,
        violation.detail,
    )
    CONTRACT_VIOLATIONS.labels(violation.service, violation.reason).inc()
    if _sentry_window.due((violation.service, violation.reason)):
        sentry_sdk = active_sentry()
        if sentry_sdk is None:
            return
        with sentry_sdk.new_scope() as scope:
            scope.set_tag("recognition.service", violation.service)
            scope.set_tag("recognition.violation", violation.reason)
            # NOTE: a stable message groups every occurrence into one Sentry issue.
            sentry_sdk.capture_message(
                f"Recognition service {violation.service} broke the contract: {violation.reason}",
                level="warning",
            )


async def fail_for_violation(
    sessions: async_sessionmaker[AsyncSession], job_id: uuid.UUID, violation: Violation
) -> list[int] | None:
    """End the waiting job ``job_id`` as ``violation.code`` and report it; the mails made final.

    None when the job is unknown or no longer waiting: then the message changes
    nothing and is only warned about, as any message off the contract.
    """
    async with sessions() as session, session.begin():
        finalized = await fail_waiting_job(
            session,
            job_id,
            code=violation.code,
            message=f"{violation.reason}: {violation.detail}",
            now=await db_now(session),
            service=None if violation.service == UNKNOWN_SERVICE else violation.service,
        )
    if finalized is None:
        logger.warning(
            "Rejected recognition message for job %s (unknown or no longer waiting): %s: %s",
            job_id,
            violation.reason,
            violation.detail,
        )
        return None
    report_violation(violation, job_id=job_id, where="message")
    return finalized
