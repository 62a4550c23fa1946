"""The NATS connection: connect with a few quick attempts, then reconnect forever.

``NatsClient`` is the one object the outbox and the bridge hold: it publishes
through ``publisher`` and subscribes through ``subscriptions`` on its connection,
and ensures the JetStream stream over request and result subjects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import nats.errors
from nats.aio.client import Client as NatsConnection
from nats.js import JetStreamContext

from mailroom.adapters.nats.backlog import InboxBacklog, read_inbox_backlog
from mailroom.adapters.nats.login import (
    connect_error,
    connect_options,
    refuse_anonymous,
    server_urls,
)
from mailroom.adapters.nats.publisher import (
    OutgoingMessage,
    PublishAck,
    PublishResult,
    publish_core,
    publish_jetstream,
)
from mailroom.adapters.nats.stream import ensure_stream, set_up_stream
from mailroom.adapters.nats.subscriptions import (
    ResultSubscription,
    subscribe_core,
    subscribe_every,
    subscribe_pull,
)
from mailroom.adapters.nats.translate import translate_errors
from mailroom.errors import NatsConfigError, NatsUnavailable
from mailroom.settings import NatsSettings

logger = logging.getLogger(__name__)

#: Errors of the first connection kept to explain its failure.
MAX_CONNECT_ERRORS = 20


class NatsClient:
    """One NATS connection with reconnects; JetStream when ``settings.jetstream``."""

    def __init__(
        self, settings: NatsSettings, *, name: str = "mailroom", ensure_stream: bool = True
    ) -> None:
        self.settings = settings
        self.name = name
        #: False: ``connect`` leaves the stream alone (the caller looks at it first).
        self._ensures_stream = ensure_stream
        self._nc: NatsConnection | None = None
        self._js: JetStreamContext | None = None
        self._closing = False
        #: The last error logged: the client retries every reconnect_wait_s and says so once.
        self._last_error: str | None = None
        #: Errors nats-py reported while connecting: a refused login ends as NoServersError.
        self._connect_errors: list[Exception] = []

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
        servers = server_urls(self.settings)
        refuse_anonymous(self.settings)
        self._closing = False
        self._connect_errors = []
        nc = NatsConnection()
        try:
            # NOTE: bounded as a whole: after a failed TLS handshake nats-py waits forever
            # for the dead stream to close (seen with a server certificate from another CA).
            await asyncio.wait_for(
                nc.connect(
                    servers=servers,
                    name=self.name,
                    **connect_options(self.settings),
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
                ),
                self._connect_budget_s(),
            )
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            self._closing = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(nc.close(), self.settings.connect_timeout_s)
            raise connect_error(self.settings, exc, self._connect_errors) from exc
        # NOTE: once connected, a lost server is retried without end: the process stays useful.
        nc.options["max_reconnect_attempts"] = -1
        self._nc = nc
        if self.jetstream:
            self._js = nc.jetstream(timeout=self.settings.publish_timeout_s)
            if not self._ensures_stream:
                return
            try:
                await self.ensure_stream()
            except BaseException:
                await self.close()
                raise

    def _connect_budget_s(self) -> float:
        """Longest the first connection may take: every attempt and wait, and a margin."""
        s = self.settings
        attempts = max(2, s.initial_connect_attempts)
        return attempts * (s.connect_timeout_s + s.reconnect_wait_s) + 1.0

    async def close(self) -> None:
        self._closing = True
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and not nc.is_closed:
            with translate_errors("close"):
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
        """Create the stream over request and result subjects when missing (``stream``)."""
        await ensure_stream(self._require_js(), self.settings, self.stream_subjects)

    async def set_up(self) -> list[str]:
        """Create or align the stream and the inbox consumer (``mailroom nats setup``)."""
        return await set_up_stream(self._require_js(), self.settings, self.stream_subjects)

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
            return await publish_jetstream(
                self._require_js(),
                messages,
                stream=self.settings.stream_name,
                timeout_s=self.settings.publish_timeout_s,
            )
        return await publish_core(
            self._require_nc(), messages, timeout_s=self.settings.publish_timeout_s
        )

    async def subscribe_results(self) -> ResultSubscription:
        """Results subject: a durable pull consumer (JetStream) or a core queue group."""
        if self.jetstream:
            return await subscribe_pull(self._require_js(), self.settings)
        return await subscribe_core(self._require_nc(), self.settings)

    async def inbox_backlog(self) -> InboxBacklog | None:
        """The inbox consumer's unread answers (None without JetStream, consumer or answer)."""
        if not self.jetstream or not self.is_connected:
            return None
        return await read_inbox_backlog(self._require_nc(), self.settings)

    async def watch(self, subject: str, *, buffer: int = 1_000) -> ResultSubscription:
        """Every message on ``subject`` (no queue group, no JetStream consumer)."""
        return await subscribe_every(self._require_nc(), subject, buffer=buffer)

    def jetstream_context(self) -> JetStreamContext:
        """The connection's JetStream API, for tools that look at the stream themselves."""
        return self._require_js()

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
        if self._nc is None:
            # The first connection's tries: ``connect`` sums them up in one line if it fails.
            if len(self._connect_errors) < MAX_CONNECT_ERRORS:
                self._connect_errors.append(exc)
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
