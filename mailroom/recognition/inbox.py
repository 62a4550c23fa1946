"""The inbox: acks and results from recognition services (ARCHITECTURE.md, Recognition).

Messages are parsed outside the database, then a batch of them is applied in
one short transaction with no network I/O: ``SELECT … FOR UPDATE`` on the
batch's jobs (in id order, so concurrent batches never deadlock each other)
waits for whoever holds them (the publisher mid-batch, the watchdog), so the
first to lock a row decides and the others see its outcome. Each message's
rules run in Python against the locked rows, in arrival order, and the changes
are written back with one statement per table. The handler is idempotent: a
redelivered message finds its effect already there and changes nothing.

A batch whose transaction fails is applied again one message per transaction,
so one message the database refuses never takes its neighbours down with it.
A batch's attempt is recorded before it is applied, so a message that kills its
worker ends its job after a bound (``inbox_attempts.py``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.models import FINAL_JOB_STATUSES
from mailroom.recognition import attempts, inbox_sql
from mailroom.recognition.contracts import (
    RecognitionResponse,
    ack_msg_id,
    result_msg_id,
)
from mailroom.recognition.finality import MAX_REASON_CHARS, short_repr
from mailroom.recognition.inbox_attempts import (
    END_BATCH,
    apply_counted,
    begin_batch,
    end_batch_apart,
)
from mailroom.recognition.inbox_messages import (
    InboxMessage,
    InboxOutcome,
    Parsed,
    parse_message,
)
from mailroom.recognition.revive import reopen_mails, revivable, revive
from mailroom.recognition.sql_params import int_array, uuid_array
from mailroom.recognition.violations import fail_for_violation
from mailroom.settings import RecognitionSettings

logger = logging.getLogger(__name__)


@dataclass
class _Job:
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
class _Batch:
    """Outcomes in message order, and the log lines to emit once the batch commits."""

    outcomes: list[InboxOutcome] = field(default_factory=list)
    logs: list[tuple[int, str, tuple[Any, ...]]] = field(default_factory=list)

    def log(self, level: int, message: str, *args: Any) -> None:
        self.logs.append((level, message, args))

    def emit(self) -> None:
        for level, message, args in self.logs:
            logger.log(level, message, *args)


def _apply_one(
    batch: _Batch, jobs: dict[uuid.UUID, _Job], parsed: Parsed, now: datetime | None
) -> None:
    """One message's rules against the locked rows (ARCHITECTURE.md, Recognition, Inbox).

    ``now`` is the caller's time, else the transaction's, which each locked row carries.
    """
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
    msg_id = parsed.msg_id
    if msg_id is None:
        derive = ack_msg_id if response.is_ack else result_msg_id
        msg_id = derive(job.id, job.row["attempt"])
        batch.log(
            logging.WARNING,
            "Recognition message for job %s has no Nats-Msg-Id; using %s",
            job.id,
            msg_id,
        )
    clock: datetime = now or job.row["db_now"]
    if response.is_ack:
        batch.outcomes.append(_apply_ack(batch, job, response, clock))
    else:
        batch.outcomes.append(_apply_result(batch, job, response, msg_id, clock))


def _apply_ack(
    batch: _Batch, job: _Job, response: RecognitionResponse, now: datetime
) -> InboxOutcome:
    if job.status == "processing":
        batch.log(logging.DEBUG, "Repeated ack for job %s ignored", job.id)
        return InboxOutcome("ack_repeated", job.id)
    _revive_if_dead_lettered(batch, job, now, ack=True)
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
    batch.log(
        logging.INFO, "Recognition job %s acked by %s", job.id, short_repr(response.service.name)
    )
    return InboxOutcome("ack_applied", job.id)


def _apply_result(
    batch: _Batch, job: _Job, response: RecognitionResponse, msg_id: str, now: datetime
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
    batch.log(logging.INFO, "Recognition job %s result applied: %s", job.id, response.status)
    return InboxOutcome("result_applied", job.id, map_job_id=job.id)


def _revive_if_dead_lettered(batch: _Batch, job: _Job, now: datetime, *, ack: bool) -> None:
    """A genuine answer to a job dead-lettered for NO_ACK takes it back (revive.py)."""
    if not revivable(job.row, now, ack=ack):
        return
    revive(job.row, now)
    job.changed = job.revived = job.metrics_changed = True
    batch.log(
        logging.WARNING, "Recognition job %s answered after its NO_ACK dead letter: revived", job.id
    )


async def _register_objects(session: AsyncSession, jobs: Sequence[_Job]) -> None:
    """Register each result object once (reusing one already there) and link it to its job."""
    wanted = {job.result_object: job.created_by for job in jobs if job.result_object}
    if not wanted:
        return
    ids = await inbox_sql.register_objects(session, wanted)
    for job in jobs:
        if job.result_object is not None:
            job.row["result_object_id"] = ids.get(job.result_object)


async def _apply_in_one_transaction(
    sessions: async_sessionmaker[AsyncSession],
    parsed: Sequence[Parsed],
    now: datetime | None,
    *,
    attempt_id: uuid.UUID | None = None,
    ids: str | None = None,
) -> _Batch:
    """Lock, apply, write back; ``attempt_id``: the batch's attempt, ended with the commit.

    ``ids``: the jobs' ``uuid[]`` literal, when the caller has it already.
    """
    batch = _Batch()
    ids = ids or uuid_array({p.response.job_id for p in parsed})
    async with sessions() as session, session.begin():
        locked = await session.execute(inbox_sql.LOCK_JOBS, {"ids": ids})
        jobs = {job.id: job for job in map(_Job, inbox_sql.locked_rows(locked))}
        for message in parsed:
            _apply_one(batch, jobs, message, now)
        changed = [job for job in jobs.values() if job.changed]
        if changed:
            await _register_objects(session, changed)
            job_rows = [
                {
                    **{name: job.row[name] for name in inbox_sql.WRITTEN},
                    "metrics_changed": job.metrics_changed,
                }
                for job in changed
            ]
            file_rows = [
                {
                    "job_id": job.id,
                    "file_id": job.row["file_id"],
                    "error": job.file_change == "error",
                    "revived": job.revived,
                    # A revived file's NO_ACK reason goes; an error result brings its own.
                    "reason": job.file_reason,
                }
                for job in changed
                if job.file_change is not None
            ]
            params = {
                "jobs": inbox_sql.to_json(job_rows),
                "job_ids": uuid_array(job.id for job in changed),
                "files": inbox_sql.to_json(file_rows),
                "file_ids": int_array(row["file_id"] for row in file_rows),
                "now": now,
                "attempt": attempt_id,
            }
            await session.execute(inbox_sql.WRITE_BACK, params)
            revived = [job for job in changed if job.revived]
            await reopen_mails(
                session, [job.id for job in revived], [job.row["file_id"] for job in revived]
            )
        elif attempt_id is not None:
            await session.execute(END_BATCH, {"id": attempt_id})
    batch.emit()
    return batch


async def apply_recognition_messages(
    sessions: async_sessionmaker[AsyncSession],
    messages: Sequence[InboxMessage],
    *,
    max_bytes: int,
    now: datetime | None = None,
    max_attempts: int = RecognitionSettings().max_processing_attempts,
    results_bucket: str | None = None,
) -> list[InboxOutcome]:
    """Apply a batch of acks and results; their outcomes, in message order.

    A result outside ``results_bucket`` (the configured one) fails its job as a contract
    violation; ``None`` leaves that check to mapping alone.

    One transaction for the whole batch. When it fails, each message is applied
    in its own transaction; one that fails there too gets a ``failed`` outcome
    carrying its error, for the caller to retry on its own. Raises when no
    message could be applied (the database is likely down: retry the batch),
    and at once when the connection was lost.
    """
    outcomes: list[InboxOutcome | None] = []
    parsed: list[tuple[int, Parsed]] = []
    for index, message in enumerate(messages):
        checked = parse_message(message, max_bytes=max_bytes, results_bucket=results_bucket)
        if isinstance(checked, InboxOutcome):
            outcomes.append(checked)
        else:
            outcomes.append(None)
            parsed.append((index, checked))
    if parsed:
        applied = await _apply_counted(sessions, [p for _, p in parsed], now, max_attempts)
        for (index, _), outcome in zip(parsed, applied, strict=True):
            outcomes[index] = outcome
    # After the batch: an answer to the same job in it wins over its broken message.
    return [await _settle_violation(sessions, o) for o in outcomes if o is not None]


async def _settle_violation(
    sessions: async_sessionmaker[AsyncSession], outcome: InboxOutcome
) -> InboxOutcome:
    """A message off the contract that names a waiting job fails that job at once."""
    if outcome.violation is None or outcome.job_id is None:
        return outcome
    finalized = await fail_for_violation(sessions, outcome.job_id, outcome.violation)
    if finalized is None:
        return outcome
    return InboxOutcome(
        "contract_violation",
        outcome.job_id,
        finalized_mail_ids=tuple(finalized),
        violation=outcome.violation,
    )


async def _apply_counted(
    sessions: async_sessionmaker[AsyncSession],
    parsed: Sequence[Parsed],
    now: datetime | None,
    max_attempts: int,
) -> list[InboxOutcome]:
    job_ids = {p.response.job_id for p in parsed}
    ids = uuid_array(job_ids)  # one literal for the attempt's row and the batch's lock
    # A live batch holding one of these jobs (an ack beside its result) is waited for, not
    # taken for a death: only a row left by a dead attempt sends the batch one by one.
    async with attempts.held(sessions, job_ids):
        return await _apply_counted_held(sessions, parsed, ids, now, max_attempts)


async def _apply_counted_held(
    sessions: async_sessionmaker[AsyncSession],
    parsed: Sequence[Parsed],
    ids: str,
    now: datetime | None,
    max_attempts: int,
) -> list[InboxOutcome]:
    attempt_id = uuid.uuid4()
    if not await begin_batch(sessions, attempt_id, ids):
        return await _apply_batch(sessions, parsed, now, attempt_id=attempt_id, ids=ids)
    # An earlier batch holding one of these jobs never came back: charge each message alone, on
    # its own job only (a batch's death says nothing about which of its messages killed it).
    await end_batch_apart(sessions, attempt_id)

    async def apply_one(message: Parsed) -> list[InboxOutcome]:
        return (await _apply_in_one_transaction(sessions, [message], now)).outcomes

    async def counted(message: Parsed) -> list[InboxOutcome]:
        return await apply_counted(sessions, message, apply_one, max_attempts=max_attempts, now=now)

    return await _apply_one_by_one(sessions, parsed, now, apply=counted)


async def _apply_batch(
    sessions: async_sessionmaker[AsyncSession],
    parsed: Sequence[Parsed],
    now: datetime | None,
    *,
    attempt_id: uuid.UUID,
    ids: str,
) -> list[InboxOutcome]:
    """The batch in one transaction, which ends its recorded attempt (``attempt_id``).

    A batch that fails is applied one by one, and its attempt is ended apart after
    that, however it ends (a death meanwhile leaves it recorded).
    """
    try:
        batch = await _apply_in_one_transaction(
            sessions, parsed, now, attempt_id=attempt_id, ids=ids
        )
        return batch.outcomes
    except BaseException as exc:
        try:
            if len(parsed) == 1 or not isinstance(exc, Exception) or _connection_lost(exc):
                raise
            logger.warning(
                "Recognition batch of %d messages failed (%s); applying them one by one",
                len(parsed),
                type(exc).__name__,
            )
            return await _apply_one_by_one(sessions, parsed, now)
        finally:
            await end_batch_apart(sessions, attempt_id)


async def _apply_one_by_one(
    sessions: async_sessionmaker[AsyncSession],
    parsed: Sequence[Parsed],
    now: datetime | None,
    *,
    apply: Callable[[Parsed], Awaitable[list[InboxOutcome]]] | None = None,
) -> list[InboxOutcome]:
    applied: list[InboxOutcome] = []
    first_error: Exception | None = None
    for message in parsed:
        try:
            if apply is not None:
                applied += await apply(message)
            else:
                applied += (await _apply_in_one_transaction(sessions, [message], now)).outcomes
        except Exception as exc:
            if _connection_lost(exc):
                raise
            first_error = first_error or exc
            logger.warning(
                "Recognition message for job %s failed on its own: %s",
                message.response.job_id,
                type(exc).__name__,
            )
            applied.append(InboxOutcome("failed", message.response.job_id, error=exc))
    if first_error is not None and all(o.applied == "failed" for o in applied):
        raise first_error
    return applied


def _connection_lost(exc: Exception) -> bool:
    return isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated


async def apply_recognition_message(
    sessions: async_sessionmaker[AsyncSession],
    *,
    subject: str,
    data: bytes,
    headers: Mapping[str, str],
    max_bytes: int,
    max_attempts: int = RecognitionSettings().max_processing_attempts,
    now: datetime | None = None,
    results_bucket: str | None = None,
) -> InboxOutcome:
    """Apply one ack or result; database errors propagate (the caller retries)."""
    [outcome] = await apply_recognition_messages(
        sessions,
        [InboxMessage(subject, data, headers)],
        max_bytes=max_bytes,
        max_attempts=max_attempts,
        now=now,
        results_bucket=results_bucket,
    )
    return outcome
