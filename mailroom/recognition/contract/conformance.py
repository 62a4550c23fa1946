"""The conformance check: play Mailroom's side against a live recognition service.

``check_service`` stores a sample file of each pipeline in the object store the
service reads, publishes requests on the request subjects (core NATS, so a repeat
is really sent again), watches the results subject without a queue group and
returns one ``CheckRow`` per rule: ack then result in time, message ids, every
message and result document against the contract, idempotency, an invalid request
answered ``INVALID_REQUEST`` and a missing object answered with an error; before
that, the buckets, and after it, how the answers travelled (``transport_check``: the
check runs on Mailroom's stream). It never touches Mailroom's database.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pydantic import ValidationError

from mailroom.adapters.nats import NatsClient, OutgoingMessage, ResultSubscription
from mailroom.adapters.storage import ObjectStore
from mailroom.errors import AppError, InvalidMessage
from mailroom.recognition.contract import rules
from mailroom.recognition.contract.models import (
    MSG_ID_HEADER,
    ObjectRef,
    Pipeline,
    RecognitionRequest,
    RecognitionResponse,
    RecognitionResult,
    dump,
    request_msg_id,
)
from mailroom.recognition.contract.puback_probe import probe_pubacks
from mailroom.recognition.contract.samples import missing_object, samples_to_send, stored
from mailroom.recognition.contract.transport_check import (
    Answer,
    AnswersStream,
    answers_stream,
    buckets_row,
    publishing_row,
)
from mailroom.settings import Settings

#: How often the collector looks for new messages, in seconds.
POLL_S = 0.05


@dataclass(frozen=True)
class CheckTimeouts:
    """How long the check waits, in seconds."""

    #: From a request to its ack.
    ack_s: float = 5.0
    #: From a request to its result; also the request's ``reply_deadline``.
    result_s: float = 15.0
    #: The longest a service may wait for a PubAck before it publishes the answer again.
    puback_s: float = 10.0


@dataclass(frozen=True)
class CheckRow:
    """One rule of the contract and whether the service kept it.

    ``warned``: kept as far as Mailroom is concerned (it accepts what the service did), but
    the service should change it; the row passes.
    """

    name: str
    passed: bool
    detail: str
    warned: bool = False

    @classmethod
    def of(cls, name: str, finding: rules.Finding) -> CheckRow:
        return cls(name, finding.level != "fail", finding.detail, warned=finding.level == "warn")


@dataclass
class _Received:
    at_s: float
    msg_id: str | None
    data: bytes
    #: The reply subject it came with (its PubAck's inbox); empty for a core publish.
    reply: str = ""


@dataclass
class _Job:
    request: RecognitionRequest
    sent_at_s: float = 0.0
    messages: list[_Received] = field(default_factory=list)

    def responses(self) -> list[tuple[_Received, RecognitionResponse]]:
        """The answers the rule book accepts (``rules.read_answer``), as the inbox reads them."""
        parsed = []
        for message in self.messages:
            try:
                parsed.append((message, rules.read_answer(message.data)))
            except InvalidMessage:
                continue
        return parsed

    def broken(self, *, ack: bool) -> list[_Received]:
        """Acks or results the rule book refuses: Mailroom ends the job ``INVALID_RESULT``."""
        return [
            m
            for m in self.messages
            if (rules.status_of(m.data) == "processing") is ack and rules.contract_problem(m.data)
        ]

    def answered(self) -> bool:
        return bool(self.results() or self.broken(ack=False))

    def results(self) -> list[tuple[_Received, RecognitionResponse]]:
        return [(m, r) for m, r in self.responses() if not r.is_ack]

    def acks(self) -> list[tuple[_Received, RecognitionResponse]]:
        return [(m, r) for m, r in self.responses() if r.is_ack]


class _Exchange:
    """Requests sent by the check and the answers seen for them, by job id."""

    def __init__(self, settings: Settings, client: NatsClient) -> None:
        self.settings = settings
        self.client = client
        self.jobs: dict[str, _Job] = {}

    def request_subject(self, pipeline: str) -> str:
        s = self.settings.nats
        return s.subject(s.image_subject if pipeline == "image" else s.tabular_subject)

    async def send(self, job: _Job, data: bytes | None = None) -> None:
        request = job.request
        self.jobs.setdefault(str(request.job_id), job)
        job.sent_at_s = job.sent_at_s or time.monotonic()
        await self.client.publish(
            OutgoingMessage(
                subject=self.request_subject(request.pipeline),
                data=data if data is not None else dump(request),
                msg_id=request_msg_id(request.job_id, request.attempt),
            )
        )

    def take(self, msg_id: str | None, data: bytes, reply: str = "") -> None:
        job = self.jobs.get(rules.job_named(msg_id, data) or "")
        if job is not None:
            job.messages.append(_Received(time.monotonic(), msg_id, data, reply))


async def check_service(
    settings: Settings,
    *,
    store: ObjectStore,
    timeouts: CheckTimeouts | None = None,
) -> list[CheckRow]:
    """Run every check against the service listening on ``settings.nats``."""
    timeouts = timeouts or CheckTimeouts()
    # The stream Mailroom reads answers from, created as Mailroom would when it is missing.
    stream = await answers_stream(settings)
    # Core NATS: a JetStream publish would drop the repeated request as a duplicate.
    client = NatsClient(settings.nats.model_copy(update={"jetstream": False}), name="conformance")
    await client.connect()
    try:
        exchange = _Exchange(settings, client)
        watch = await client.watch(settings.nats.subject(settings.nats.results_subject))
        collector = asyncio.create_task(_collect(watch, exchange))
        try:
            return await _run(exchange, store, timeouts, stream)
        finally:
            collector.cancel()
            await asyncio.gather(collector, return_exceptions=True)
            await watch.close()
    finally:
        await client.close()
        if stream is not None:
            await stream.close()


async def _collect(watch: ResultSubscription, exchange: _Exchange) -> None:
    while True:
        for message in await watch.fetch(100, POLL_S * 10):
            exchange.take(message.headers.get(MSG_ID_HEADER), message.data, message.reply)


async def _run(
    exchange: _Exchange, store: ObjectStore, timeouts: CheckTimeouts, stream: AnswersStream | None
) -> list[CheckRow]:
    deadline = datetime.now(UTC) + timedelta(seconds=timeouts.result_s)
    # Before the samples are stored: a put would create a missing bucket on S3.
    buckets = await buckets_row(store)
    to_send, unchecked = samples_to_send(exchange.settings.recognition)
    rows: list[CheckRow] = [CheckRow(buckets.name, buckets.passed, buckets.detail)]
    rows += [CheckRow(f"file types ({p})", False, why) for p, why in unchecked.items()]
    if not to_send:
        return [*rows, CheckRow("file types", False, "no pipeline declares a type to check")]
    samples = {
        s.pipeline: _Job(_request(s.pipeline, s.file_type, await stored(store, s), deadline))
        for s in to_send
    }
    first = to_send[0]  # the missing object and the broken request: a type the service reads
    missing = _Job(
        _request(first.pipeline, first.file_type, missing_object(store, first), deadline)
    )
    invalid = _Job(_request(first.pipeline, first.file_type, missing.request.s3, deadline))
    # Breaks the contract (unknown pipeline, no object to read) but names its job.
    invalid_body = json.loads(dump(invalid.request))
    invalid_body["pipeline"] = "audio"
    del invalid_body["s3"]

    for job in samples.values():
        await exchange.send(job)
    await exchange.send(missing)
    await exchange.send(invalid, json.dumps(invalid_body).encode())
    everyone = [*samples.values(), missing, invalid]
    await _wait_until(lambda: all(j.answered() for j in everyone), timeouts.result_s)

    # Idempotency: the first sample's request again, once its first result is in.
    repeated = samples[first.pipeline]
    repeat_sent_at_s: float | None = None
    if repeated.results():
        repeat_sent_at_s = time.monotonic()
        await exchange.send(repeated)
        await _wait_until(
            lambda: any(m.at_s > repeat_sent_at_s for m, _ in repeated.results()),
            timeouts.result_s,
        )

    attempts = exchange.settings.recognition.automatic_attempts
    for name, job in samples.items():
        rows.append(_ack_row(name, job, timeouts))
        rows.append(_result_row(name, job, timeouts, attempts))
    rows.append(_msg_id_row(everyone))
    publishing = publishing_row(
        (Answer(m.msg_id, m.reply) for job in everyone for m in job.messages),
        stream=stream.name if stream else None,
        subject=exchange.settings.nats.subject(exchange.settings.nats.results_subject),
    )
    rows.append(
        CheckRow(publishing.name, publishing.passed, publishing.detail, warned=publishing.warned)
    )
    # Last, as it keeps the stream from acknowledging while it runs.
    probe = _Job(_request(first.pipeline, first.file_type, repeated.request.s3, deadline))

    found = await probe_pubacks(
        stream,
        send=lambda: exchange.send(probe),
        answers=lambda: [message.msg_id for message in probe.messages],
        wait_s=timeouts.puback_s,
    )
    rows.append(CheckRow(found.name, found.passed, found.detail, warned=found.warned))
    rows.append(_contract_row(everyone))
    rows.append(await _document_row(list(samples.values()), store, exchange.settings))
    rows.append(_idempotency_row(repeated, repeat_sent_at_s))
    rows.append(_invalid_row(invalid))
    rows.append(_missing_row(missing, attempts))
    return rows


def _request(
    pipeline: Pipeline, file_type: str, ref: ObjectRef, deadline: datetime
) -> RecognitionRequest:
    return RecognitionRequest(
        job_id=uuid.uuid4(),
        file_id=uuid.uuid4().int % 2**31,
        pipeline=pipeline,
        file_type=file_type,
        original_name=f"conformance-sample.{file_type}",
        s3=ref,
        reply_deadline=deadline,
        attempt=1,
    )


async def _wait_until(done: Callable[[], bool], timeout_s: float) -> None:
    ends = time.monotonic() + timeout_s
    while not done() and time.monotonic() < ends:
        await asyncio.sleep(POLL_S)


def _ack_row(pipeline: str, job: _Job, timeouts: CheckTimeouts) -> CheckRow:
    name = f"ack ({pipeline})"
    acks, results = job.acks(), job.results()
    if not acks:
        broken = job.broken(ack=True)
        if broken:
            problem = rules.contract_problem(broken[0].data)
            return CheckRow(name, False, f"{problem}: Mailroom ends the job INVALID_RESULT")
        return CheckRow(name, False, f"no ack within {timeouts.ack_s:g} s")
    waited = acks[0][0].at_s - job.sent_at_s
    if waited > timeouts.ack_s:
        return CheckRow(name, False, f"ack after {waited:.2f} s (limit {timeouts.ack_s:g} s)")
    order = rules.ordering_finding(acks[0][0].at_s, results[0][0].at_s if results else None)
    if order.level != "pass":
        return CheckRow.of(name, order)
    return CheckRow(name, True, f"ack after {waited:.2f} s, before the result")


def _result_row(pipeline: str, job: _Job, timeouts: CheckTimeouts, attempts: int) -> CheckRow:
    name = f"result ({pipeline})"
    results = job.results()
    if not results:
        broken = job.broken(ack=False)
        if broken:
            problem = rules.contract_problem(broken[0].data)
            return CheckRow(name, False, f"{problem}: Mailroom ends the job INVALID_RESULT")
        return CheckRow(name, False, f"no result within {timeouts.result_s:g} s")
    received, response = results[0]
    waited = received.at_s - job.sent_at_s
    outcome = rules.outcome_of(response, automatic_attempts=attempts)
    if response.status == "error":
        return CheckRow(name, False, f"the sample was answered error: {outcome}")
    return CheckRow(name, True, f"{response.status} after {waited:.2f} s; {outcome}")


def _msg_id_row(jobs: list[_Job]) -> CheckRow:
    name = "message ids"
    count = 0
    warning: rules.Finding | None = None
    for job in jobs:
        request = job.request
        for message in job.messages:
            count += 1
            ack = rules.status_of(message.data) == "processing"
            finding = rules.msg_id_finding(message.msg_id, request.job_id, request.attempt, ack=ack)
            if finding.level == "fail":
                return CheckRow.of(name, finding)
            warning = warning or (finding if finding.level == "warn" else None)
    if warning is not None:
        return CheckRow.of(name, warning)
    return CheckRow(name, count > 0, f"{count} messages with {{job_id}}:{{attempt}}:ack|result")


def _contract_row(jobs: list[_Job]) -> CheckRow:
    name = "messages match the contract"
    count = 0
    for job in jobs:
        for message in job.messages:
            count += 1
            problem = _response_problem(job.request, message.data)
            if problem:
                return CheckRow(name, False, f"{message.msg_id or 'no msg id'}: {problem}")
    versions = [rules.version_finding(r.schema_version) for j in jobs for _, r in j.responses()]
    for version in (v for v in versions if v.level != "pass"):  # a previous major, still read
        return CheckRow.of(name, version)
    return CheckRow(name, count > 0, f"{count} messages valid (recognition_response.schema.json)")


def _response_problem(request: RecognitionRequest, data: bytes) -> str | None:
    problem = rules.contract_problem(data)
    if problem:
        return problem
    response = rules.read_answer(data)
    if response.file_id != request.file_id:
        return f"file_id {response.file_id}, the request's is {request.file_id}"
    return None


async def _document_row(jobs: list[_Job], store: ObjectStore, settings: Settings) -> CheckRow:
    name = "result documents match the contract"
    results_bucket = store.bucket("results")
    checked = 0
    for job in jobs:
        for _, response in job.results():
            ref = response.result_s3
            if ref is None:
                continue
            checked += 1
            where = f"{ref.bucket}/{ref.key}"
            if ref.bucket != results_bucket:
                return CheckRow(name, False, f"{where} is not in the results bucket")
            try:
                size = await store.size(ref.bucket, ref.key)
                if size > settings.recognition.max_result_bytes:
                    return CheckRow(name, False, f"{where} has {size} bytes, over the limit")
                document = RecognitionResult.model_validate_json(
                    await store.get(ref.bucket, ref.key)
                )
            except ValidationError as exc:
                first = exc.errors(include_url=False, include_input=False)[0]
                return CheckRow(
                    name, False, f"{where}: {'.'.join(map(str, first['loc']))}: {first['msg']}"
                )
            except AppError as exc:
                return CheckRow(name, False, f"{where} cannot be read: {exc}")
            if document.job_id != job.request.job_id:
                return CheckRow(name, False, f"{where} names job {document.job_id}")
    if not checked:
        return CheckRow(name, False, "no done / needs_check result named a document")
    return CheckRow(name, True, f"{checked} documents valid (recognition_result.schema.json)")


def _idempotency_row(job: _Job, repeat_sent_at_s: float | None) -> CheckRow:
    name = "idempotency (same request twice)"
    results = job.results()
    if repeat_sent_at_s is None:
        return CheckRow(name, False, _silence(job, "no result to the first request"))
    if not any(message.at_s > repeat_sent_at_s for message, _ in results):
        return CheckRow(name, False, "no answer to the repeated request")
    answers = [_answer_of(response) for _, response in results]
    for answer in answers[1:]:
        if answer != answers[0]:
            return CheckRow(name, False, f"first answer {answers[0]}, then {answer}")
    return CheckRow(name, True, f"the same answer twice: {answers[0]}")


def _answer_of(response: RecognitionResponse) -> str:
    if response.error is not None:
        return f"{response.status} {response.error.code}"
    if response.result_s3 is not None:
        return f"{response.status} {response.result_s3.bucket}/{response.result_s3.key}"
    return response.status


def _invalid_row(job: _Job) -> CheckRow:
    name = "invalid request → INVALID_REQUEST"
    results = job.results()
    if not results:
        return CheckRow(name, False, _silence(job, "no answer to a request off the contract"))
    answer = _answer_of(results[0][1])
    if answer != "error INVALID_REQUEST":
        return CheckRow(name, False, f"answered {answer}")
    return CheckRow(name, True, "error INVALID_REQUEST")


def _silence(job: _Job, said: str) -> str:
    """``said`` when the service did not answer; what was wrong when it answered off the contract."""
    broken = job.broken(ack=False)
    if broken:
        return f"answered off the contract ({rules.contract_problem(broken[0].data)})"
    return said


def _missing_row(job: _Job, attempts: int) -> CheckRow:
    name = "missing object → error"
    results = job.results()
    if not results:
        return CheckRow(name, False, _silence(job, "silence for a key that does not exist"))
    response = results[0][1]
    if response.status != "error":
        return CheckRow(name, False, f"answered {response.status}")
    return CheckRow(name, True, rules.outcome_of(response, automatic_attempts=attempts))
