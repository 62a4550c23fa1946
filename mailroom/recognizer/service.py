"""The reference recognizer: a small recognition service that speaks the NATS contract.

A stand-in for an external service (dev, demo, tests). It talks to NATS with
nats-py directly, on purpose not through Mailroom's adapter, so the contract is
exercised from the other side. For each request it acks (``processing``), reads
the file from the object store, extracts fields, writes the result JSON to the
results bucket and publishes the result. It is idempotent by job id + attempt:
a repeated request republishes the answer it gave (kept in a bounded LRU, or
found in the results bucket) without extracting again. Faults can be switched
on for tests (``RecognizerFaults``). The result documents of jobs that finish
together are written together (``ResultWrites``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from importlib.metadata import PackageNotFoundError, version

import nats.errors
from nats.aio.client import Client as NatsConnection
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import ValidationError

from mailroom.adapters.storage import ObjectStore, build_store
from mailroom.errors import (
    AppError,
    ExtractionError,
    InvalidKey,
    ObjectNotFound,
    RetryableError,
)
from mailroom.recognition.contract.models import (
    RESULT_SCHEMA_VERSION,
    ObjectRef,
    RecognitionRequest,
    RecognitionResponse,
    RecognitionResult,
    ResponseError,
    ResponseMetrics,
    ServiceInfo,
    ack_msg_id,
    dump,
    result_msg_id,
)
from mailroom.recognizer.answers import AnswerPublisher
from mailroom.recognizer.connect import connect
from mailroom.recognizer.extraction import extract
from mailroom.recognizer.faults import RecognizerFaults
from mailroom.recognizer.parsing import named_job, parse_request
from mailroom.recognizer.writes import ResultWrites, result_key
from mailroom.settings import Settings

logger = logging.getLogger(__name__)

#: A field below this confidence makes the whole result ``needs_check``.
NEEDS_CHECK_BELOW = 0.8
#: Answers remembered for repeated requests.
CACHE_SIZE = 1_024
#: Requests worked on at once.
MAX_CONCURRENCY = 16
#: How long ``stop`` waits for requests in flight, in seconds.
DRAIN_TIMEOUT_S = 30.0
#: Error codes of transient failures: not remembered, a repeated request tries again.
TRANSIENT_CODES = frozenset({"STORAGE_UNAVAILABLE", "INTERNAL_ERROR"})
#: Files up to this size are extracted on the event loop, larger ones in a thread: a thread
#: hop costs about as much CPU as extracting a small CSV (~0.1 ms each), in bytes.
INLINE_EXTRACT_MAX_BYTES = 4 * 1024

JobKey = tuple[uuid.UUID, int]


def service_version() -> str:
    try:
        return version("mailroom")
    except PackageNotFoundError:
        return "0.0.0"


class ReferenceRecognizer:
    """The service: ``start()`` subscribes both request subjects, ``stop()`` drains."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: ObjectStore | None = None,
        faults: RecognizerFaults | None = None,
        cache_size: int = CACHE_SIZE,
    ) -> None:
        self.settings = settings
        self.faults = faults or RecognizerFaults()
        self.service = ServiceInfo(name=settings.recognizer.service_name, version=service_version())
        #: Files read and extracted so far (a repeated request does not count).
        self.extractions = 0
        self._owns_store = store is None
        self._store = store if store is not None else build_store(settings)
        self._results = ResultWrites(self._store)
        self._cache_size = cache_size
        self._answers: OrderedDict[JobKey, RecognitionResponse] = OrderedDict()
        self._in_flight: set[JobKey] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(MAX_CONCURRENCY)
        self._nc: NatsConnection | None = None
        self._out: AnswerPublisher | None = None
        #: The flush the answers published since it was begun wait for (see ``_flush``).
        self._next_flush: asyncio.Future[None] | None = None
        self._subs: list[Subscription] = []
        self._stopping = False
        #: Set when the NATS connection closed for good (not by ``stop``).
        self.connection_lost = asyncio.Event()

    @property
    def results_subject(self) -> str:
        return self.settings.nats.subject(self.settings.nats.results_subject)

    @property
    def request_subjects(self) -> list[str]:
        nats_settings = self.settings.nats
        return [
            nats_settings.subject(nats_settings.tabular_subject),
            nats_settings.subject(nats_settings.image_subject),
        ]

    async def start(self) -> None:
        """Connect and subscribe; returns once the server has the subscriptions."""
        self._stopping = False

        async def on_closed() -> None:
            if not self._stopping:
                logger.error("recognizer: NATS connection closed")
                self.connection_lost.set()

        self._nc = await connect(self.settings.nats, name=self.service.name, on_closed=on_closed)
        self._out = AnswerPublisher(
            self._nc,
            self.results_subject,
            timeout_s=self.settings.nats.publish_timeout_s,
            jetstream=self.settings.nats.jetstream,
        )
        queue = self.settings.nats.recognizer_queue_group
        for subject in self.request_subjects:
            self._subs.append(await self._nc.subscribe(subject, queue=queue, cb=self._on_request))
        await self._nc.flush()
        logger.info(
            "recognizer: listening on %s (queue %s), faults %s",
            ", ".join(self.request_subjects),
            queue,
            self.faults,
        )

    async def stop(self) -> None:
        """Stop taking requests, finish the ones in flight, then close the connection."""
        self._stopping = True
        nc = self._nc
        subs, self._subs = self._subs, []
        try:
            if nc is not None and not nc.is_closed:
                for sub in subs:
                    with contextlib.suppress(nats.errors.Error):
                        await sub.unsubscribe()
            await self._finish_in_flight()
            if nc is not None and not nc.is_closed:
                await nc.drain()
        finally:
            self._nc = None
            if self._owns_store:
                close = getattr(self._store, "close", None)
                if close is not None:
                    close()

    async def _finish_in_flight(self) -> None:
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=DRAIN_TIMEOUT_S)
        if pending:
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)
            logger.warning("recognizer: %d requests abandoned at stop", len(pending))

    async def __aenter__(self) -> ReferenceRecognizer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _on_request(self, msg: Msg) -> None:
        # The subscription hands messages over one at a time: work on each in its own task.
        task = asyncio.create_task(self._handle(msg.subject, msg.data))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, subject: str, data: bytes) -> None:
        request = parse_request(subject, data)
        if request is None:
            await self._refuse(data)
            return
        key: JobKey = (request.job_id, request.attempt)
        async with self._slots:
            answer = self._answers.get(key)
            if answer is not None:
                self._answers.move_to_end(key)
                logger.info(
                    "recognizer: job %s attempt %d repeated; republishing its %s result",
                    request.job_id,
                    request.attempt,
                    answer.status,
                )
                await self._publish_result(request, answer)
                return
            if key in self._in_flight:
                logger.info(
                    "recognizer: job %s attempt %d repeated while in progress; ignored",
                    request.job_id,
                    request.attempt,
                )
                return
            self._in_flight.add(key)
            try:
                answer = await self._answer(request)
            except Exception:
                logger.exception("recognizer: job %s failed unexpectedly", request.job_id)
                answer = self._error(request, "INTERNAL_ERROR", "the recognizer failed")
            finally:
                self._in_flight.discard(key)
            if answer.error is None or answer.error.code not in TRANSIENT_CODES:
                self._remember(key, answer)
            await self._publish_result(request, answer)

    async def _answer(self, request: RecognitionRequest) -> RecognitionResponse:
        """Ack, then work out the result (from the results bucket if it is there)."""
        if self.faults.drop_acks:
            logger.info("recognizer: job %s ack dropped (fault)", request.job_id)
        else:
            ack = RecognitionResponse(
                job_id=request.job_id,
                file_id=request.file_id,
                status="processing",
                service=self.service,
            )
            try:
                await self._publish(ack, ack_msg_id(request.job_id, request.attempt))
            except (AppError, nats.errors.Error, OSError) as exc:
                # A lost ack never blocks a result: the inbox accepts a result without one.
                logger.warning(
                    "recognizer: job %s ack not published: %s", request.job_id, type(exc).__name__
                )
        if self.faults.delay_s > 0:
            await asyncio.sleep(self.faults.delay_s)
        if self.faults.fail_with:
            return self._error(request, self.faults.fail_with, "failure injected for tests")

        key = result_key(request.job_id, request.attempt)
        results_bucket = self._store.bucket("results")
        try:
            stored = await self._stored_result(results_bucket, key)
            if stored is not None:
                logger.info("recognizer: job %s result reused from the store", request.job_id)
                return self._result(request, stored, ObjectRef(bucket=results_bucket, key=key))
            data = await self._store.get(request.s3.bucket, request.s3.key)
        except ObjectNotFound:
            return self._error(request, "NOT_FOUND", "the file is not in the object store")
        except InvalidKey as exc:
            return self._error(request, "INVALID_REQUEST", str(exc))
        except RetryableError as exc:
            return self._error(request, "STORAGE_UNAVAILABLE", str(exc))

        self.extractions += 1
        try:
            if len(data) <= INLINE_EXTRACT_MAX_BYTES:
                extraction = extract(data, request.file_type)
            else:
                extraction = await asyncio.to_thread(extract, data, request.file_type)
        except ExtractionError as exc:
            return self._error(request, exc.code, str(exc))
        result = RecognitionResult(
            job_id=request.job_id,
            document_type=extraction.document_type,
            fields=extraction.fields,
        )
        try:
            # Not ``dump``: its exclude_none would drop ``value: null``, which is required.
            body = result.model_dump_json().encode()
            ref = await self._results.put(key, body)
        except RetryableError as exc:
            return self._error(request, "STORAGE_UNAVAILABLE", str(exc))
        return self._result(request, result, ObjectRef(bucket=ref.bucket, key=ref.key))

    async def _stored_result(self, bucket: str, key: str) -> RecognitionResult | None:
        if not await self._store.exists(bucket, key):
            return None
        try:
            return RecognitionResult.model_validate_json(await self._store.get(bucket, key))
        except ValidationError:
            logger.warning(
                "recognizer: stored result %s/%s is invalid; extracting again", bucket, key
            )
            return None

    def _result(
        self, request: RecognitionRequest, result: RecognitionResult, ref: ObjectRef
    ) -> RecognitionResponse:
        confidences = [f.confidence for f in result.fields.values()]
        low = sum(1 for c in confidences if c < NEEDS_CHECK_BELOW)
        unrecognized = sum(1 for f in result.fields.values() if f.value is None)
        status = "done" if confidences and not low else "needs_check"
        return RecognitionResponse(
            job_id=request.job_id,
            file_id=request.file_id,
            status=status,
            service=self.service,
            result_s3=ref,
            result_schema_version=RESULT_SCHEMA_VERSION,
            metrics=ResponseMetrics(
                fields_total=len(confidences),
                fields_low_confidence=low,
                fields_unrecognized=unrecognized,
            ),
        )

    def _error(self, request: RecognitionRequest, code: str, message: str) -> RecognitionResponse:
        return RecognitionResponse(
            job_id=request.job_id,
            file_id=request.file_id,
            status="error",
            service=self.service,
            error=ResponseError(code=code[:100], message=message[:4000]),
        )

    async def _refuse(self, data: bytes) -> None:
        """Answer ``INVALID_REQUEST`` to a request that breaks the contract but names its job."""
        named = named_job(data)
        if named is None or self.faults.drop_results:
            return
        job_id, file_id, attempt = named
        answer = RecognitionResponse(
            job_id=job_id,
            file_id=file_id,
            status="error",
            service=self.service,
            error=ResponseError(code="INVALID_REQUEST", message="the request breaks the contract"),
        )
        try:
            await self._publish(answer, result_msg_id(job_id, attempt))
            await self._flush()
        except (AppError, nats.errors.Error, OSError) as exc:
            logger.warning(
                "recognizer: job %s refusal not published: %s", job_id, type(exc).__name__
            )

    def _remember(self, key: JobKey, answer: RecognitionResponse) -> None:
        self._answers[key] = answer
        self._answers.move_to_end(key)
        while len(self._answers) > self._cache_size:
            self._answers.popitem(last=False)

    async def _publish_result(
        self, request: RecognitionRequest, answer: RecognitionResponse
    ) -> None:
        if self.faults.drop_results:
            logger.info("recognizer: job %s result dropped (fault)", request.job_id)
            return
        msg_id = result_msg_id(request.job_id, request.attempt)
        copies = 2 if self.faults.duplicate_results else 1
        try:
            for _ in range(copies):
                await self._publish(answer, msg_id)
            await self._flush()
        except (AppError, nats.errors.Error, OSError) as exc:
            # The answer stays remembered: the publisher's republish gets it next time.
            logger.warning(
                "recognizer: job %s result not published: %s", request.job_id, type(exc).__name__
            )
            return
        logger.info(
            "recognizer: job %s attempt %d answered %s",
            request.job_id,
            request.attempt,
            answer.status,
        )

    async def _publish(self, response: RecognitionResponse, msg_id: str) -> None:
        self._connection()
        assert self._out is not None
        await self._out.publish(dump(response), msg_id)

    async def _flush(self) -> None:
        """Return once the server has every answer published before this call.

        A flush is a PING and its PONG, after the publishes buffered before it. The answers
        published while one is due share it: the first starts it, it is begun on the loop's
        next turn, and answers published after that wait for the next one.
        """
        if self._out is not None and self._out.captured:
            return  # each answer waited for the stream's acknowledgement
        if self._next_flush is None:
            self._next_flush = asyncio.ensure_future(self._flush_shared())
            # Read by whoever still waits; marked retrieved for when all of them were cancelled.
            self._next_flush.add_done_callback(_retrieved)
        await asyncio.shield(self._next_flush)

    async def _flush_shared(self) -> None:
        await asyncio.sleep(0)  # the answers published in this turn join
        self._next_flush = None  # those from now on wait for a flush begun after them
        await self._connection().flush()

    def _connection(self) -> NatsConnection:
        if self._nc is None:
            raise AppError("the recognizer is not connected")
        return self._nc


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
