"""NATS adapter: connection, request publishing (core or JetStream), result subscriptions.

nats-py errors stop here and leave as ``mailroom.errors`` types. The outbox needs
only ``RequestPublisher`` (met by ``NatsClient`` and ``InMemoryPublisher``); the
bridge needs ``NatsClient.subscribe_results``, which hides whether results come
from a core queue group or a durable JetStream pull consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsConnection
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    PubAck,
    StorageType,
    StreamConfig,
)

from mailroom.errors import PermanentError, RetryableError
from mailroom.recognition.contracts import MSG_ID_HEADER
from mailroom.settings import NatsSettings

logger = logging.getLogger(__name__)

#: JetStream API error code for "stream name already in use" (with another config).
STREAM_NAME_IN_USE = 10058


class NatsUnavailable(RetryableError):
    """The NATS server could not be reached or the connection is down."""


class NatsPublishFailed(RetryableError):
    """A publish was not confirmed (flush or JetStream ack failed or timed out)."""


class NatsConfigError(PermanentError):
    """NATS refused our stream or consumer configuration."""


@contextlib.contextmanager
def _translate_errors(what: str) -> Iterator[None]:
    try:
        yield
    except TimeoutError as exc:  # before OSError: TimeoutError is one of its children
        raise NatsPublishFailed(f"{what}: timed out") from exc
    except (
        nats.errors.ConnectionClosedError,
        nats.errors.NoServersError,
        nats.errors.StaleConnectionError,
        nats.errors.ConnectionReconnectingError,
        nats.errors.ConnectionDrainingError,
        OSError,
    ) as exc:
        raise NatsUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc
    except nats.js.errors.BadRequestError as exc:
        raise NatsConfigError(f"{what}: {exc}") from exc
    except nats.errors.Error as exc:
        raise NatsPublishFailed(f"{what}: {type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True)
class OutgoingMessage:
    """One message to publish, with its stable dedupe key."""

    subject: str
    data: bytes
    msg_id: str


@dataclass(frozen=True)
class PublishAck:
    """Proof that a message left: core NATS flush, or a JetStream ack."""

    msg_id: str
    #: JetStream saw this ``Nats-Msg-Id`` within its duplicate window and dropped the copy.
    duplicate: bool = False
    stream: str | None = None
    seq: int | None = None


#: Per message of a batch, in order: its ack, or the error that kept it from being confirmed.
PublishResult = PublishAck | RetryableError | PermanentError


class RequestPublisher(Protocol):
    """What the outbox needs from NATS."""

    @property
    def is_connected(self) -> bool: ...

    async def publish_batch(self, messages: Sequence[OutgoingMessage]) -> list[PublishResult]:
        """Publish ``messages`` in order and confirm them; never raises for one message."""
        ...


@dataclass
class IncomingMessage:
    """A message for the bridge; ``ack`` confirms it (a no-op on core NATS)."""

    subject: str
    data: bytes
    headers: dict[str, str]
    ack: Callable[[], Awaitable[None]]
    nak: Callable[[], Awaitable[None]]


class ResultSubscription(Protocol):
    async def fetch(self, batch: int, timeout_s: float) -> list[IncomingMessage]: ...

    async def close(self) -> None: ...


async def _noop() -> None:
    return None


class NatsClient:
    """One NATS connection with reconnects; JetStream when ``settings.jetstream``."""

    def __init__(self, settings: NatsSettings, *, name: str = "mailroom") -> None:
        self.settings = settings
        self.name = name
        self._nc: NatsConnection | None = None
        self._js: JetStreamContext | None = None
        self._closing = False
        #: The last error logged: the client retries every reconnect_wait_s and says so once.
        self._last_error: str | None = None

    @property
    def jetstream(self) -> bool:
        return self.settings.jetstream

    @property
    def stream_subjects(self) -> list[str]:
        s = self.settings
        return [
            s.subject(s.tabular_subject),
            s.subject(s.image_subject),
            s.subject(s.results_subject),
        ]

    @property
    def is_connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    async def connect(self) -> None:
        """Connect (a few quick attempts), then reconnect forever; ensure the stream."""
        if self._nc is not None:
            return
        self._closing = False
        nc = NatsConnection()
        try:
            await nc.connect(
                servers=[self.settings.url],
                name=self.name,
                connect_timeout=self.settings.connect_timeout_s,  # type: ignore[arg-type]
                # A silently dead server (no RST) is noticed after the unanswered PINGs,
                # not after nats-py's default of minutes; then the client reconnects.
                ping_interval=self.settings.ping_interval_s,  # type: ignore[arg-type]
                max_outstanding_pings=self.settings.max_outstanding_pings,
                reconnect_time_wait=self.settings.reconnect_wait_s,  # type: ignore[arg-type]
                max_reconnect_attempts=max(1, self.settings.initial_connect_attempts - 1),
                error_cb=self._on_error,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
            )
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            self._closing = True
            await nc.close()
            raise NatsUnavailable(f"connect {self.settings.url}: {type(exc).__name__}") from exc
        # NOTE: once connected, a lost server is retried without end: the process stays useful.
        nc.options["max_reconnect_attempts"] = -1
        self._nc = nc
        if self.jetstream:
            self._js = nc.jetstream(timeout=self.settings.publish_timeout_s)
            try:
                await self.ensure_stream()
            except BaseException:
                await self.close()
                raise

    async def close(self) -> None:
        self._closing = True
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and not nc.is_closed:
            with _translate_errors("close"):
                await nc.close()

    async def drain(self) -> None:
        """Stop subscriptions after their pending messages, flush, then close."""
        self._closing = True
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and not nc.is_closed:
            try:
                await nc.drain()
            except (TimeoutError, nats.errors.Error, OSError) as exc:
                logger.warning("NATS drain failed, closing: %s", type(exc).__name__)
                await nc.close()

    async def ensure_stream(self) -> None:
        """Create (or align) the stream over request and result subjects."""
        js = self._require_js()
        config = StreamConfig(
            name=self.settings.stream_name,
            subjects=self.stream_subjects,
            duplicate_window=float(self.settings.duplicate_window_s),
            max_age=self.settings.stream_max_age_s,
            storage=StorageType.FILE,
        )
        with _translate_errors(f"stream {self.settings.stream_name}"):
            try:
                await js.add_stream(config)
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code != STREAM_NAME_IN_USE:
                    raise
                await js.update_stream(config)

    async def publish(self, message: OutgoingMessage) -> PublishAck:
        """Publish one message and confirm it (flush or JetStream ack)."""
        result = (await self.publish_batch([message]))[0]
        if isinstance(result, Exception):
            raise result
        return result

    async def publish_batch(self, messages: Sequence[OutgoingMessage]) -> list[PublishResult]:
        if not messages:
            return []
        if self.jetstream:
            return await self._publish_batch_jetstream(messages)
        return await self._publish_batch_core(messages)

    async def _publish_batch_core(self, messages: Sequence[OutgoingMessage]) -> list[PublishResult]:
        nc = self._require_nc()
        results: list[PublishResult] = []
        for index, message in enumerate(messages):
            try:
                with _translate_errors(f"publish {message.msg_id}"):
                    await nc.publish(
                        message.subject, message.data, headers={MSG_ID_HEADER: message.msg_id}
                    )
            except (RetryableError, PermanentError) as exc:
                # Later messages were never handed over: they share this error.
                return results + [exc] * (len(messages) - index)
            results.append(PublishAck(msg_id=message.msg_id))
        try:
            with _translate_errors("flush"):
                # A PONG proves the server read everything written before the PING.
                await nc.flush(timeout=self.settings.publish_timeout_s)  # type: ignore[arg-type]
        except (RetryableError, PermanentError) as exc:
            return [exc] * len(messages)
        return results

    async def _publish_batch_jetstream(
        self, messages: Sequence[OutgoingMessage]
    ) -> list[PublishResult]:
        js = self._require_js()
        futures: list[asyncio.Future[PubAck]] = []
        failed: RetryableError | PermanentError | None = None
        for message in messages:
            try:
                with _translate_errors(f"publish {message.msg_id}"):
                    pending_ack = await js.publish_async(
                        message.subject,
                        message.data,
                        stream=self.settings.stream_name,
                        headers={MSG_ID_HEADER: message.msg_id},
                    )
            except (RetryableError, PermanentError) as exc:
                failed = exc
                break
            futures.append(pending_ack)
        results: list[PublishResult] = []
        if futures:
            _done, pending = await asyncio.wait(futures, timeout=self.settings.publish_timeout_s)
            for future in pending:
                future.cancel()
            for message, future in zip(messages, futures, strict=False):
                results.append(self._ack_of(message, future))
        if failed is not None:
            results += [failed] * (len(messages) - len(results))
        return results

    @staticmethod
    def _ack_of(message: OutgoingMessage, future: asyncio.Future[PubAck]) -> PublishResult:
        if future.cancelled():
            return NatsPublishFailed(f"publish {message.msg_id}: no JetStream ack in time")
        exc = future.exception()
        if exc is not None:
            try:
                with _translate_errors(f"publish {message.msg_id}"):
                    raise exc
            except (RetryableError, PermanentError) as translated:
                return translated
        ack = future.result()
        return PublishAck(
            msg_id=message.msg_id, duplicate=bool(ack.duplicate), stream=ack.stream, seq=ack.seq
        )

    async def subscribe_results(self) -> ResultSubscription:
        """Results subject: a durable pull consumer (JetStream) or a core queue group."""
        s = self.settings
        subject = s.subject(s.results_subject)
        if self.jetstream:
            js = self._require_js()
            config = ConsumerConfig(
                durable_name=s.inbox_durable,
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                ack_wait=s.bridge_ack_wait_s,
                filter_subject=subject,
            )
            with _translate_errors(f"consumer {s.inbox_durable}"):
                sub = await js.pull_subscribe(
                    subject, durable=s.inbox_durable, stream=s.stream_name, config=config
                )
            return _PullSubscription(sub)
        nc = self._require_nc()
        core = _CoreSubscription(buffer=s.bridge_fetch_batch)
        with _translate_errors(f"subscribe {subject}"):
            # Past these limits nats-py drops results (slow consumer, logged by _on_error)
            # rather than grow without bound: core NATS is at most once anyway, and the
            # outbox (no ack) or the watchdog (no result) settles a job whose answer is lost.
            core.sub = await nc.subscribe(
                subject,
                queue=s.inbox_queue_group,
                cb=core.on_message,
                pending_msgs_limit=s.core_pending_msgs_limit,
                pending_bytes_limit=s.core_pending_bytes_limit,
            )
            # Core NATS drops what is published before the server has the SUB, so
            # "subscribed" means the server answered a PING sent after it.
            await nc.flush(timeout=s.publish_timeout_s)  # type: ignore[arg-type]
        return core

    def _require_nc(self) -> NatsConnection:
        if self._nc is None or not self._nc.is_connected:
            raise NatsUnavailable("not connected to NATS")
        return self._nc

    def _require_js(self) -> JetStreamContext:
        self._require_nc()
        if self._js is None:
            raise NatsConfigError("JetStream is disabled (nats.jetstream)")
        return self._js

    async def _on_error(self, exc: Exception) -> None:
        if self._closing:
            return
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if error != self._last_error:
            # NOTE: not the URL: it may carry a password; the error names host and port.
            logger.warning("NATS error (%s): %s", self.name, error)
            self._last_error = error

    async def _on_disconnected(self) -> None:
        if self._closing:
            return
        logger.warning("NATS disconnected (%s); reconnecting", self.name)

    async def _on_reconnected(self) -> None:
        self._last_error = None
        logger.info("NATS reconnected (%s)", self.name)


def _headers(msg: Msg) -> dict[str, str]:
    return dict(msg.headers or {})


class _PullSubscription:
    def __init__(self, sub: JetStreamContext.PullSubscription) -> None:
        self._sub = sub

    async def fetch(self, batch: int, timeout_s: float) -> list[IncomingMessage]:
        try:
            with _translate_errors("fetch"):
                msgs = await self._sub.fetch(batch, timeout=timeout_s)
        except NatsPublishFailed as exc:
            if isinstance(exc.__cause__, TimeoutError):
                return []  # nothing arrived within the wait
            raise
        return [
            IncomingMessage(
                subject=m.subject, data=m.data, headers=_headers(m), ack=m.ack, nak=m.nak
            )
            for m in msgs
        ]

    async def close(self) -> None:
        with contextlib.suppress(nats.errors.Error), _translate_errors("unsubscribe"):
            await self._sub.unsubscribe()


class _CoreSubscription:
    """Queue-group subscription; a local queue turns pushed messages into fetches."""

    def __init__(self, *, buffer: int) -> None:
        self.sub: Subscription | None = None
        # NOTE: bounded, so a slow bridge makes ``on_message`` wait and the backlog stays
        # in nats-py's pending queue, where the subscription's pending limits apply.
        self._queue: asyncio.Queue[Msg] = asyncio.Queue(maxsize=max(1, buffer))

    async def on_message(self, msg: Msg) -> None:
        await self._queue.put(msg)

    async def fetch(self, batch: int, timeout_s: float) -> list[IncomingMessage]:
        try:
            first = await asyncio.wait_for(self._queue.get(), timeout_s)
        except TimeoutError:
            return []
        msgs = [first]
        while len(msgs) < batch and not self._queue.empty():
            msgs.append(self._queue.get_nowait())
        return [
            IncomingMessage(
                subject=m.subject, data=m.data, headers=_headers(m), ack=_noop, nak=_noop
            )
            for m in msgs
        ]

    async def close(self) -> None:
        if self.sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self.sub.unsubscribe()


@dataclass
class InMemoryPublisher:
    """A ``RequestPublisher`` for unit tests: records messages, dedupes by msg id like JetStream."""

    connected: bool = True
    #: Fail the publish of this message (0-based, counted over the fake's life).
    fail_at: int | None = None
    published: list[OutgoingMessage] = field(default_factory=list)
    _attempts: int = 0
    _seen: set[str] = field(default_factory=set)

    @property
    def is_connected(self) -> bool:
        return self.connected

    async def publish_batch(self, messages: Sequence[OutgoingMessage]) -> list[PublishResult]:
        results: list[PublishResult] = []
        for index, message in enumerate(messages):
            if not self.connected or self._attempts == self.fail_at:
                self._attempts += 1
                error = NatsPublishFailed(f"publish {message.msg_id}: injected failure")
                return results + [error] * (len(messages) - index)
            self._attempts += 1
            duplicate = message.msg_id in self._seen
            self._seen.add(message.msg_id)
            self.published.append(message)
            results.append(PublishAck(msg_id=message.msg_id, duplicate=duplicate))
        return results
