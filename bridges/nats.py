"""NATS bridge: recognition acks and results → ``apply_recognition_messages`` actor messages.

Messages travel in batches: what one fetch returns, topped up for a short
linger, bounded by count and bytes, becomes one actor message (the inbox then
applies it in one transaction). With JetStream a durable pull consumer feeds
the bridge (any number of bridges share it) and a message is acked only after
its batch's actor message was enqueued (on a Redis with replicas: and confirmed
by a replica, ``actors/broker/replicated.py``), so a bridge killed in between, or
a Redis master lost before its replica had the batch, leaves it to be
redelivered. Without JetStream a core queue group shares the subject between
bridges (at most once). SIGTERM or SIGINT: stop fetching, finish the
batch in hand, drain, exit 0.

An outage of NATS or of the broker is logged once when it starts, at most once
per back-off step and once when it ends (``OutageLog``). A NATS server that
refuses the credentials at the start is no outage: one line, exit 2.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from prometheus_client import Counter

from mailroom.adapters.nats import IncomingMessage, NatsClient, ResultSubscription
from mailroom.errors import AppError, NatsLoginRefused
from mailroom.process.outage import OutageLog
from mailroom.process.stop_signals import handle_stop_signals
from mailroom.redaction import mask_urls
from mailroom.settings import Settings

logger = logging.getLogger(__name__)

METRIC_MESSAGES = Counter(
    "mailroom_nats_bridge_messages_total",
    "Recognition messages the NATS bridge handled, by outcome.",
    ["outcome"],
)

#: Sends one actor message for a batch of ``{"subject", "data" (base64), "headers"}`` items.
#: Blocking (a broker call).
Send = Callable[[list[dict[str, Any]]], object]

#: Exit status when the NATS server refuses the credentials (a configuration error).
EXIT_LOGIN_REFUSED = 2
#: Wait after a failed fetch or send before trying again, in seconds.
ERROR_BACKOFF_S = 1.0
#: Longest wait for more messages to fill a batch after the first ones arrived, in seconds.
LINGER_S = 0.02
#: Most NATS body bytes in one actor message (one larger message still goes, alone).
MAX_BATCH_BYTES = 1024 * 1024


class NatsBridge:
    """The bridge loop, runnable in-process (tests) or from ``run`` (the CLI)."""

    def __init__(
        self,
        client: NatsClient,
        send: Send,
        *,
        settings: Settings,
        linger_s: float = LINGER_S,
        max_batch_bytes: int = MAX_BATCH_BYTES,
    ) -> None:
        self.client = client
        self.send = send
        self.settings = settings
        self.linger_s = linger_s
        self.max_batch_bytes = max_batch_bytes
        #: Most NATS messages in one actor message.
        self.max_batch = max(1, settings.nats.bridge_fetch_batch)
        self.batches = 0
        self.forwarded = 0
        self.dropped = 0
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()
        servers = ", ".join(mask_urls(url) for url in settings.nats.server_urls)
        self.nats_outage = OutageLog(f"NATS {servers}", logger=logger)
        broker = mask_urls(settings.broker_redis_url)
        if settings.redis.sentinels:
            broker = f"redis sentinel master {settings.broker_redis.sentinel_master}"
        self.broker_outage = OutageLog(
            f"Broker {broker}", logger=logger, doing="the answers wait in NATS"
        )

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def run(self) -> int:
        """Connect, subscribe, forward until stopped; 0 on a clean stop, 2 on a refused login."""
        try:
            subscription = await self._subscribe()
        except NatsLoginRefused as exc:
            logger.error("NATS bridge cannot start: %s", exc)
            await self.client.close()
            return EXIT_LOGIN_REFUSED
        if subscription is None:
            return 0
        self.ready.set()
        logger.info("NATS bridge ready (jetstream=%s)", self.client.jetstream)
        try:
            while not self.stopping:
                try:
                    batch = await subscription.fetch(
                        self.max_batch, self.settings.nats.bridge_fetch_timeout_s
                    )
                    if batch:
                        batch += await self._linger(subscription, len(batch))
                    self.nats_outage.recovered()
                except AppError as exc:
                    self.nats_outage.failed(f"fetch failed: {exc}", exc=exc)
                    await self._pause()
                    continue
                if batch and not await self.forward(batch):
                    await self._pause()
        finally:
            await subscription.close()
            await self.client.drain()
        logger.info("NATS bridge stopped: %d forwarded, %d dropped", self.forwarded, self.dropped)
        return 0

    async def _linger(self, subscription: ResultSubscription, have: int) -> list[IncomingMessage]:
        """More messages for a batch of ``have``, for up to ``linger_s``.

        An error here only ends the linger: the messages in hand still go out,
        and the next fetch meets the error again.
        """
        more: list[IncomingMessage] = []
        deadline = time.monotonic() + self.linger_s
        while have + len(more) < self.max_batch and not self.stopping:
            left = deadline - time.monotonic()
            if left <= 0.001:
                break
            try:
                fetched = await subscription.fetch(self.max_batch - have - len(more), left)
            except AppError:
                break
            if not fetched:
                break
            more += fetched
        return more

    async def forward(self, batch: Sequence[IncomingMessage]) -> bool:
        """Send the batch as actor messages, then ack what was sent; False when sending failed."""
        limit = self.settings.recognition.max_message_bytes
        keep = [m for m in batch if len(m.data) <= limit]
        for message in batch:
            if len(message.data) > limit:
                self.dropped += 1
                METRIC_MESSAGES.labels("dropped").inc()
                # The subject is untrusted text: its repr, cut to 80 characters.
                logger.warning(
                    "Dropped recognition message on %.80r: %d bytes exceeds %d",
                    message.subject,
                    len(message.data),
                    limit,
                )
                await message.ack()
        for chunk in self._chunks(keep):
            items = [
                {
                    "subject": m.subject,
                    "data": base64.b64encode(m.data).decode(),
                    "headers": m.headers,
                }
                for m in chunk
            ]
            try:
                await asyncio.to_thread(self.send, items)
            except Exception as exc:
                # NOTE: unacked messages stay with JetStream and come back after ack_wait.
                METRIC_MESSAGES.labels("send_failed").inc(len(chunk))
                self.broker_outage.failed(
                    f"enqueueing {len(chunk)} recognition messages failed: {type(exc).__name__}",
                    exc=exc,
                )
                return False
            self.broker_outage.recovered()
            for message in chunk:
                await message.ack()
            self.forwarded += len(chunk)
            self.batches += 1
            METRIC_MESSAGES.labels("forwarded").inc(len(chunk))
        return True

    def _chunks(self, messages: Sequence[IncomingMessage]) -> list[list[IncomingMessage]]:
        """``messages`` in order, cut into batches bounded by count and body bytes."""
        chunks: list[list[IncomingMessage]] = []
        size = 0
        for message in messages:
            if (
                not chunks
                or len(chunks[-1]) >= self.max_batch
                or size + len(message.data) > self.max_batch_bytes
            ):
                chunks.append([])
                size = 0
            chunks[-1].append(message)
            size += len(message.data)
        return chunks

    async def _subscribe(self) -> ResultSubscription | None:
        """Connect and subscribe, retrying an outage; ``NatsLoginRefused`` ends the attempts."""
        while not self.stopping:
            try:
                await self.client.connect()
                subscription = await self.client.subscribe_results()
            except NatsLoginRefused:
                raise
            except AppError as exc:
                self.nats_outage.failed(f"cannot subscribe: {exc}", exc=exc)
                await self.client.close()
                await self._pause()
                continue
            self.nats_outage.recovered()
            return subscription
        return None

    async def _pause(self) -> None:
        try:
            await asyncio.wait_for(self._stop.wait(), ERROR_BACKOFF_S)
        except TimeoutError:
            pass


async def _main(settings: Settings, send: Send) -> int:
    bridge = NatsBridge(NatsClient(settings.nats, name="mailroom-bridge"), send, settings=settings)
    loop = asyncio.get_running_loop()
    handle_stop_signals(lambda *_: loop.call_soon_threadsafe(bridge.stop))
    return await bridge.run()


def run(settings: Settings) -> int:
    """Run the bridge until SIGTERM/SIGINT; the process exit code."""
    from mailroom import queues as actor_names
    from mailroom.process.observability import start_metrics_server

    # Batches go to the inbox actor by name: this process loads no actor module.
    actor_names.only_send()
    from actors.broker.transport import send_confirmed, set_sending_broker

    broker = set_sending_broker(settings)
    start_metrics_server(settings)
    try:
        # Confirmed by a Redis replica where there is one: once acked, JetStream forgets the
        # batch, and a failover must not lose it (actors/broker/replicated.py).
        send = partial(send_confirmed, actor_names.APPLY_RECOGNITION_MESSAGES)
        return asyncio.run(_main(settings, send))
    finally:
        broker.close()
