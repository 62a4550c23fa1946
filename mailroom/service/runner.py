"""The protocol of a recognition service, around a function that reads one file.

``RecognitionService`` subscribes the request subjects in a queue group and, for each
request: acks it (``processing``), reads the file through ``Objects``, calls ``recognize``,
writes the result document to the results bucket, then publishes the result, every answer
through ``AnswerPublisher`` (JetStream with its PubAck where a stream captures the answers
subject). It is idempotent by job id + attempt: a repeated request gets the answer it had
(remembered in a bounded LRU, or found in the results bucket) without reading the file
again, and a request that breaks the contract but names its job is answered
``INVALID_REQUEST``. The NATS connection is the caller's: connect it as your deployment
needs (servers, credentials, TLS) and close it after ``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import nats.errors
from nats.aio.client import Client as NatsConnection
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import ValidationError

from mailroom.recognition.contract.models import (
    ObjectRef,
    RecognitionRequest,
    RecognitionResponse,
    RecognitionResult,
    ServiceInfo,
    ack_msg_id,
    dump,
    result_msg_id,
)
from mailroom.service import answering
from mailroom.service.answering import Failure, result_key
from mailroom.service.publish import AnswerPublisher
from mailroom.service.requests import named_job, parse_request
from mailroom.service.wire import flushed

logger = logging.getLogger(__name__)

#: The queue group services of Mailroom's deployments subscribe in.
DEFAULT_QUEUE = "mailroom-recognizer"
#: Answers remembered for repeated requests.
CACHE_SIZE = 1_024
#: Requests worked on at once.
MAX_CONCURRENCY = 16
#: How long ``stop`` waits for requests in flight, in seconds.
DRAIN_TIMEOUT_S = 30.0

JobKey = tuple[uuid.UUID, int]
#: Reads one file (the request says what it is) into a result document, or says why not.
Recognize = Callable[[RecognitionRequest, bytes], Awaitable[RecognitionResult | Failure]]


class Objects(Protocol):
    """The object store the files are read from and result documents written to.

    Any exception but ``ValueError`` (an unusable key: ``INVALID_REQUEST``) is answered
    ``STORAGE_UNAVAILABLE``, which Mailroom retries.
    """

    #: The bucket result documents go to (Mailroom's ``storage.results_bucket``).
    results_bucket: str

    async def read(self, bucket: str, key: str) -> bytes | None:
        """The object's bytes; None when it does not exist."""
        ...

    async def write_result(self, key: str, body: bytes) -> ObjectRef:
        """Store a result document in the results bucket; where it was stored."""
        ...


class RecognitionService:
    """``start()`` subscribes the request subjects, ``stop()`` finishes what is in flight."""

    def __init__(
        self,
        nc: NatsConnection,
        *,
        objects: Objects,
        recognize: Recognize,
        service: ServiceInfo,
        request_subjects: Sequence[str],
        answers_subject: str,
        queue: str = DEFAULT_QUEUE,
        publish_timeout_s: float = 5.0,
        jetstream: bool = True,
        needs_check_below: float = answering.NEEDS_CHECK_BELOW,
        cache_size: int = CACHE_SIZE,
        max_concurrency: int = MAX_CONCURRENCY,
    ) -> None:
        self.nc = nc
        self.objects = objects
        self.recognize = recognize
        self.service = service
        self.request_subjects = list(request_subjects)
        self.answers_subject = answers_subject
        self.queue = queue
        self.needs_check_below = needs_check_below
        self.answers = AnswerPublisher(
            nc, answers_subject, timeout_s=publish_timeout_s, jetstream=jetstream
        )
        self._cache_size = cache_size
        self._remembered: OrderedDict[JobKey, RecognitionResponse] = OrderedDict()
        self._in_flight: set[JobKey] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(max_concurrency)
        self._subs: list[Subscription] = []

    async def start(self) -> None:
        """Subscribe; returns once the server has the subscriptions."""
        for subject in self.request_subjects:
            self._subs.append(await self.nc.subscribe(subject, queue=self.queue, cb=self._on_msg))
        await flushed(self.nc)

    async def stop(self) -> None:
        """Take no more requests and finish the ones in flight (the connection stays open)."""
        subs, self._subs = self._subs, []
        if not self.nc.is_closed:
            for sub in subs:
                with contextlib.suppress(nats.errors.Error):
                    await sub.unsubscribe()
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=DRAIN_TIMEOUT_S)
        if pending:
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)
            logger.warning("service: %d requests abandoned at stop", len(pending))

    async def publish(self, response: RecognitionResponse, msg_id: str) -> None:
        """Publish one answer, confirmed (PubAck, or a flush on core NATS)."""
        await self.answers.publish(dump(response), msg_id)

    async def publish_ack(self, ack: RecognitionResponse, attempt: int) -> None:
        await self.publish(ack, ack_msg_id(ack.job_id, attempt))

    async def publish_result(self, result: RecognitionResponse, attempt: int) -> None:
        await self.publish(result, result_msg_id(result.job_id, attempt))

    async def _on_msg(self, msg: Msg) -> None:
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
            answer = self._remembered.get(key)
            if answer is not None:
                self._remembered.move_to_end(key)
                logger.info("service: job %s repeated; its %s again", request.job_id, answer.status)
                await self._send_result(request, answer)
                return
            if key in self._in_flight:
                logger.info("service: job %s repeated while in progress; ignored", request.job_id)
                return
            self._in_flight.add(key)
            try:
                answer = await self.answer(request)
            except Exception:
                logger.exception("service: job %s failed unexpectedly", request.job_id)
                answer = self._error(request, "INTERNAL_ERROR", "the service failed")
            finally:
                self._in_flight.discard(key)
            if answer.error is None or answer.error.code not in answering.TRANSIENT_CODES:
                self.remember(key, answer)
            await self._send_result(request, answer)

    async def answer(self, request: RecognitionRequest) -> RecognitionResponse:
        """Ack, then work out the result (from the results bucket if it is there)."""
        try:
            await self.publish_ack(answering.ack(request, self.service), request.attempt)
        except (nats.errors.Error, OSError) as exc:
            # A lost ack never blocks a result: Mailroom accepts a result without one.
            logger.warning("service: job %s ack not published: %r", request.job_id, exc)
        key = result_key(request.job_id, request.attempt)
        try:
            stored = await self._stored_result(key)
            if stored is not None:
                logger.info("service: job %s result reused from the store", request.job_id)
                ref = ObjectRef(bucket=self.objects.results_bucket, key=key)
                return self._result(request, stored, ref)
            data = await self.objects.read(request.s3.bucket, request.s3.key)
        except ValueError as exc:
            return self._error(request, "INVALID_REQUEST", str(exc))
        except Exception as exc:  # the partner's store: any failure of it is an outage
            return self._unavailable(request, exc)
        if data is None:
            return self._error(request, "NOT_FOUND", "the file is not in the object store")
        outcome = await self.recognize(request, data)
        if isinstance(outcome, Failure):
            return answering.error(request.job_id, request.file_id, outcome, self.service)
        try:
            # Not ``dump``: its exclude_none would drop ``value: null``, which is required.
            ref = await self.objects.write_result(key, outcome.model_dump_json().encode())
        except Exception as exc:
            return self._unavailable(request, exc)
        return self._result(request, outcome, ref)

    def remember(self, key: JobKey, answer: RecognitionResponse) -> None:
        self._remembered[key] = answer
        self._remembered.move_to_end(key)
        while len(self._remembered) > self._cache_size:
            self._remembered.popitem(last=False)

    async def _stored_result(self, key: str) -> RecognitionResult | None:
        body = await self.objects.read(self.objects.results_bucket, key)
        if body is None:
            return None
        try:
            return RecognitionResult.model_validate_json(body)
        except ValidationError:
            logger.warning("service: stored result %s is invalid; reading the file again", key)
            return None

    def _result(
        self, request: RecognitionRequest, document: RecognitionResult, ref: ObjectRef
    ) -> RecognitionResponse:
        return answering.result(
            request, document, ref, self.service, needs_check_below=self.needs_check_below
        )

    def _unavailable(self, request: RecognitionRequest, exc: Exception) -> RecognitionResponse:
        logger.warning("service: job %s: the object store failed: %s", request.job_id, exc)
        return self._error(request, "STORAGE_UNAVAILABLE", _described(exc))

    def _error(self, request: RecognitionRequest, code: str, message: str) -> RecognitionResponse:
        return answering.error(
            request.job_id, request.file_id, Failure(code, message), self.service
        )

    async def _send_result(self, request: RecognitionRequest, answer: RecognitionResponse) -> None:
        try:
            await self.publish_result(answer, request.attempt)
        except (nats.errors.Error, OSError) as exc:
            # The answer stays remembered: Mailroom's republish gets it next time.
            logger.warning("service: job %s result not published: %r", request.job_id, exc)
            return
        logger.info(
            "service: job %s attempt %d answered %s", request.job_id, request.attempt, answer.status
        )

    async def _refuse(self, data: bytes) -> None:
        """Answer ``INVALID_REQUEST`` to a request that breaks the contract but names its job."""
        named = named_job(data)
        if named is None:
            return
        job_id, file_id, attempt = named
        failure = Failure("INVALID_REQUEST", "the request breaks the contract")
        try:
            await self.publish_result(
                answering.error(job_id, file_id, failure, self.service), attempt
            )
        except (nats.errors.Error, OSError) as exc:
            logger.warning("service: job %s refusal not published: %r", job_id, exc)


def _described(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]
