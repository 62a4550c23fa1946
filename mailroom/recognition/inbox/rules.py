"""The inbox's rules: each message against the locked job rows, in arrival order.

Pure Python between the lock and the write-back (``inbox.py``): what each ack and
result does to its job and file (ARCHITECTURE.md, Recognition, Inbox).
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from mailroom.db.models import FINAL_JOB_STATUSES
from mailroom.recognition.contract import rules
from mailroom.recognition.contract.models import RecognitionResponse
from mailroom.recognition.finality import MAX_REASON_CHARS, short_repr
from mailroom.recognition.inbox.messages import InboxOutcome, Parsed
from mailroom.recognition.inbox.revive import revivable, revive

logger = logging.getLogger("mailroom.recognition.inbox.apply")


@dataclass
class Job:
    """A locked job row, changed in place as the batch's messages apply in order."""

    row: dict[str, Any]
    changed: bool = False
    #: Taken out of a NO_ACK dead letter by this batch (revive.py).
    revived: bool = False
    #: ``metrics`` to be written (a result's, a revival's trace, an attempt given back).
    metrics_changed: bool = False
    #: The file change this batch asks for: ``None``, ``"processing"`` or ``"error"``.
    file_change: str | None = None
    file_reason: str | None = None
    result_object: tuple[str, str] | None = None
    created_by: str = ""
    #: The row's id, kept as a field: a batch reads it several times per message.
    id: uuid.UUID = field(init=False)

    def __post_init__(self) -> None:
        self.id = cast(uuid.UUID, self.row["id"])

    @property
    def status(self) -> str:
        return cast(str, self.row["status"])


@dataclass
class Batch:
    """Outcomes in message order, and the log lines to emit once the batch commits.

    What went as expected (an ack, a ``done`` result) is one DEBUG line per job and one
    INFO line per batch with the counts: an INFO line per job cost the worker about as
    much CPU as applying it. A result that is not ``done`` and everything that goes
    wrong keep a line of their own, with the job's id.
    """

    outcomes: list[InboxOutcome] = field(default_factory=list)
    logs: list[tuple[int, str, tuple[Any, ...]]] = field(default_factory=list)
    acks: int = 0
    #: Results applied, by the status they gave their job.
    results: Counter[str] = field(default_factory=Counter)
    #: (bucket, key) of result documents named by answers the batch did not keep (late, for
    #: an unknown or erased job, not of the job's attempt): deleted unless registered.
    unkept: list[tuple[str, str]] = field(default_factory=list)

    def log(self, level: int, message: str, *args: Any) -> None:
        self.logs.append((level, message, args))

    def emit(self) -> None:
        for level, message, args in self.logs:
            logger.log(level, message, *args)
        if self.acks or self.results:
            statuses = ", ".join(f"{status} {n}" for status, n in sorted(self.results.items()))
            logger.info(
                "Recognition batch applied %d ack(s) and %d result(s)%s",
                self.acks,
                self.results.total(),
                f" ({statuses})" if statuses else "",
            )


def apply_one(
    batch: Batch, jobs: dict[uuid.UUID, Job], parsed: Parsed, now: datetime | None
) -> None:
    """One message's rules against the locked rows (ARCHITECTURE.md, Recognition, Inbox).

    ``now`` is the caller's time, else the transaction's, which each locked row carries.
    """
    outcomes = len(batch.outcomes)
    _apply_one(batch, jobs, parsed, now)
    if batch.outcomes[outcomes:] and batch.outcomes[-1].applied in _NOT_KEPT:
        ref = parsed.response.result_s3
        if ref is not None and parsed.in_results_bucket:
            # Nothing refers to it, and nothing will: the document (the file's content as
            # recognized) goes, so an erased or settled mail leaves none behind.
            batch.unkept.append((ref.bucket, ref.key))


#: Outcomes of a result that is not applied to its job.
_NOT_KEPT = frozenset(
    {"unknown_job", "file_mismatch", "msg_id_mismatch", "result_late", "result_duplicate"}
)


def _apply_one(
    batch: Batch, jobs: dict[uuid.UUID, Job], parsed: Parsed, now: datetime | None
) -> None:
    response = parsed.response
    job = jobs.get(response.job_id)
    if job is None:
        batch.log(
            logging.WARNING,
            "Recognition message on %r for unknown job %s",
            parsed.subject,
            response.job_id,
        )
        batch.outcomes.append(InboxOutcome("unknown_job", response.job_id))
        return
    if job.row["file_id"] != response.file_id:
        batch.log(
            logging.WARNING,
            "Recognition message for job %s names file %d, the job's file is %d; ignored",
            job.id,
            response.file_id,
            job.row["file_id"],
        )
        batch.outcomes.append(InboxOutcome("file_mismatch", job.id))
        return
    msg_id = rules.answer_msg_id(parsed.msg_id, job.id, job.row["attempt"], ack=response.is_ack)
    named = rules.msg_id_finding(parsed.msg_id, job.id, job.row["attempt"], ack=response.is_ack)
    if named.level == "warn":
        batch.log(
            logging.WARNING,
            "Recognition message for job %s has no Nats-Msg-Id; using %s",
            job.id,
            msg_id,
        )
    elif named.level == "fail":
        # An answer names the request it answers: one under another attempt or another job's
        # id answers no request of this job (forged, or misdirected), and one of the other
        # kind would make JetStream drop the job's ack or result as a duplicate of the other.
        batch.log(
            logging.WARNING,
            "Recognition message for job %s ignored: its Nats-Msg-Id %s is not of attempt %d "
            "as its %s",
            job.id,
            short_repr(msg_id),
            job.row["attempt"],
            "ack" if response.is_ack else "result",
        )
        batch.outcomes.append(InboxOutcome("msg_id_mismatch", job.id))
        return
    clock: datetime = now or job.row["db_now"]
    if response.is_ack:
        batch.outcomes.append(_apply_ack(batch, job, response, clock))
    else:
        batch.outcomes.append(_apply_result(batch, job, response, msg_id, clock))


def _apply_ack(
    batch: Batch, job: Job, response: RecognitionResponse, now: datetime
) -> InboxOutcome:
    if job.status == "processing":
        batch.log(logging.DEBUG, "Repeated ack for job %s ignored", job.id)
        return InboxOutcome("ack_repeated", job.id)
    _revive_if_dead_lettered(batch, job, now, ack=True)
    if job.status in FINAL_JOB_STATUSES and job.row["result_msg_id"] is not None:
        # The service answered: its ack and result went out together and the result was
        # applied first (parallel inbox batches). Nothing is wrong, so no warning.
        batch.log(logging.DEBUG, "Ack for job %s came after its result; ignored", job.id)
        return InboxOutcome("ack_after_result", job.id)
    if job.status != "published":
        batch.log(logging.WARNING, "Ack for job %s in status %s ignored", job.id, job.status)
        return InboxOutcome("ack_unexpected", job.id)
    job.row.update(
        status="processing",
        started_at=now,
        service_name=response.service.name,
        service_version=response.service.version,
    )
    job.changed = True
    job.file_change = job.file_change or "processing"
    batch.acks += 1
    batch.log(
        logging.DEBUG, "Recognition job %s acked by %s", job.id, short_repr(response.service.name)
    )
    return InboxOutcome("ack_applied", job.id)


def _apply_result(
    batch: Batch, job: Job, response: RecognitionResponse, msg_id: str, now: datetime
) -> InboxOutcome:
    row = job.row
    if row["result_msg_id"] == msg_id:
        batch.log(logging.DEBUG, "Duplicate result %s for job %s ignored", msg_id, job.id)
        return InboxOutcome("result_duplicate", job.id)
    _revive_if_dead_lettered(batch, job, now, ack=False)
    if job.status in FINAL_JOB_STATUSES:
        batch.log(
            logging.WARNING,
            "Late result for job %s ignored: the job is already %s",
            job.id,
            job.status,
        )
        return InboxOutcome("result_late", job.id)

    theirs = response.metrics.model_dump(exclude_none=True) if response.metrics else {}
    ours = row["metrics"] if isinstance(row["metrics"], dict) else {}
    error_class = rules.answer_error_class(response)
    if error_class is not None:
        # Decided here, where the answer is: mapping retries by it (``rules.is_retried``).
        theirs = {**theirs, rules.ERROR_CLASS_KEY: error_class}
    error = response.error
    error_code = (error.code if error else "SERVICE_ERROR") if response.status == "error" else None
    error_message = (error.message[:MAX_REASON_CHARS] if error else None) if error_code else None
    result_s3 = response.result_s3
    row.update(
        status=response.status,
        finished_at=now,
        service_name=response.service.name,
        service_version=response.service.version,
        metrics={**ours, **theirs},
        fields_total=theirs.get("fields_total"),
        fields_low_confidence=theirs.get("fields_low_confidence"),
        fields_unrecognized=theirs.get("fields_unrecognized"),
        error_code=error_code,
        error_message=error_message,
        result_schema_version=response.result_schema_version,
        result_object_id=None,
        result_msg_id=msg_id,
    )
    job.changed = job.metrics_changed = True
    job.result_object = (result_s3.bucket, result_s3.key) if result_s3 else None
    job.created_by = f"recognition:{response.service.name}"[:100]
    if response.status == "error":
        job.file_change = "error"
        job.file_reason = f"{error_code}: {error_message or ''}"[:MAX_REASON_CHARS]
    else:
        job.file_change = job.file_change or "processing"
    batch.results[response.status] += 1
    level = logging.DEBUG if response.status == "done" else logging.INFO
    batch.log(level, "Recognition job %s result applied: %s", job.id, response.status)
    return InboxOutcome("result_applied", job.id, map_job_id=job.id)


def _revive_if_dead_lettered(batch: Batch, job: Job, now: datetime, *, ack: bool) -> None:
    """A genuine answer to a job dead-lettered for NO_ACK takes it back (revive.py)."""
    if not revivable(job.row, now, ack=ack):
        return
    revive(job.row, now)
    job.changed = job.revived = job.metrics_changed = True
    batch.log(
        logging.WARNING, "Recognition job %s answered after its NO_ACK dead letter: revived", job.id
    )
