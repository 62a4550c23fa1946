"""The reference recognizer: a small recognition service built on the service kit.

A stand-in for an external service (dev, demo, tests). The protocol is
``mailroom.service`` (the kit a partner would use), so the contract is exercised
from the other side; this module adds what is Mailroom's own: the connection from
the settings, the object store, the rule-based extraction, result documents written
together (``ResultWrites``) and faults switched on for tests (``RecognizerFaults``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from nats.aio.client import Client as NatsConnection

from mailroom.adapters.storage import ObjectStore, build_store
from mailroom.errors import ExtractionError, InvalidKey, ObjectNotFound
from mailroom.recognition.contract.models import (
    ObjectRef,
    RecognitionRequest,
    RecognitionResponse,
    RecognitionResult,
    ServiceInfo,
)
from mailroom.recognizer.connect import connect
from mailroom.recognizer.extraction import extract
from mailroom.recognizer.faults import RecognizerFaults
from mailroom.recognizer.writes import ResultWrites
from mailroom.service import Failure, RecognitionService
from mailroom.service.runner import CACHE_SIZE
from mailroom.settings import Settings

logger = logging.getLogger(__name__)

#: Files up to this size are extracted on the event loop, larger ones in a thread: a thread
#: hop costs about as much CPU as extracting a small CSV (~0.1 ms each), in bytes.
INLINE_EXTRACT_MAX_BYTES = 4 * 1024


def service_version() -> str:
    try:
        return version("mailroom")
    except PackageNotFoundError:
        return "0.0.0"


class ReferenceRecognizer:
    """The service: ``start()`` connects and subscribes both request subjects, ``stop()`` drains."""

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
        self._objects = _StoreObjects(self._store)
        self._cache_size = cache_size
        self._nc: NatsConnection | None = None
        self.kit: RecognitionService | None = None
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
        self.kit = _FaultyService(
            self._nc,
            faults=lambda: self.faults,
            objects=self._objects,
            recognize=self.recognize,
            service=self.service,
            request_subjects=self.request_subjects,
            answers_subject=self.results_subject,
            queue=self.settings.nats.recognizer_queue_group,
            publish_timeout_s=self.settings.nats.publish_timeout_s,
            jetstream=self.settings.nats.jetstream,
            cache_size=self._cache_size,
        )
        await self.kit.start()
        logger.info(
            "recognizer: listening on %s (queue %s), faults %s",
            ", ".join(self.request_subjects),
            self.kit.queue,
            self.faults,
        )

    async def stop(self) -> None:
        """Stop taking requests, finish the ones in flight, then close the connection."""
        self._stopping = True
        nc, kit = self._nc, self.kit
        try:
            if kit is not None:
                await kit.stop()
            if nc is not None and not nc.is_closed:
                await nc.drain()
        finally:
            self._nc = None
            if self._owns_store:
                close = getattr(self._store, "close", None)
                if close is not None:
                    close()

    async def __aenter__(self) -> ReferenceRecognizer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def recognize(
        self, request: RecognitionRequest, data: bytes
    ) -> RecognitionResult | Failure:
        """Extract the fields of one file by rules (the kit did the rest)."""
        if self.faults.delay_s > 0:
            await asyncio.sleep(self.faults.delay_s)
        if self.faults.fail_with:
            return Failure(self.faults.fail_with, "failure injected for tests")
        self.extractions += 1
        try:
            if len(data) <= INLINE_EXTRACT_MAX_BYTES:
                extraction = extract(data, request.file_type)
            else:
                extraction = await asyncio.to_thread(extract, data, request.file_type)
        except ExtractionError as exc:
            return Failure(exc.code, str(exc))
        return RecognitionResult(
            job_id=request.job_id, document_type=extraction.document_type, fields=extraction.fields
        )


class _StoreObjects:
    """Mailroom's object store as the kit's ``Objects``; result documents written together."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.results_bucket = store.bucket("results")
        self._writes = ResultWrites(store)

    async def read(self, bucket: str, key: str) -> bytes | None:
        try:
            return await self.store.get(bucket, key)
        except ObjectNotFound:
            return None
        except InvalidKey as exc:
            raise ValueError(str(exc)) from exc

    async def write_result(self, key: str, body: bytes) -> ObjectRef:
        stored = await self._writes.put(key, body)
        return ObjectRef(bucket=stored.bucket, key=stored.key)


class _FaultyService(RecognitionService):
    """The kit with the faults tests switch on (none by default)."""

    def __init__(
        self, nc: NatsConnection, *, faults: Callable[[], RecognizerFaults], **kwargs: Any
    ) -> None:
        super().__init__(nc, **kwargs)
        #: The recognizer's faults as they are now (tests switch them at runtime).
        self.faults = faults

    async def publish_ack(self, ack: RecognitionResponse, attempt: int) -> None:
        if self.faults().drop_acks:
            logger.info("recognizer: job %s ack dropped (fault)", ack.job_id)
            return
        await super().publish_ack(ack, attempt)

    async def publish_result(self, result: RecognitionResponse, attempt: int) -> None:
        if self.faults().drop_results:
            logger.info("recognizer: job %s result dropped (fault)", result.job_id)
            return
        for _ in range(2 if self.faults().duplicate_results else 1):
            await super().publish_result(result, attempt)
