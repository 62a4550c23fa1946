"""NATS bridge: recognition acks and results → ``apply_recognition_message`` actor messages.

With JetStream a durable pull consumer feeds the bridge (any number of bridges
share it) and a message is acked only after its actor message was enqueued, so
a bridge killed in between leaves it to be redelivered. Without JetStream a
core queue group shares the subject between bridges (at most once). SIGTERM
or SIGINT: stop fetching, finish the batch in hand, drain, exit 0.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import signal
from collections.abc import Callable, Sequence

from actors.recognition import apply_recognition_message
from mailroom.adapters.nats import IncomingMessage, NatsClient, ResultSubscription
from mailroom.errors import AppError
from mailroom.recognition.finality import short_repr
from mailroom.settings import Settings

logger = logging.getLogger(__name__)

#: Sends one actor message: (subject, base64 body, headers). Blocking (a broker call).
Send = Callable[[str, str, dict[str, str]], object]

#: Wait after a failed fetch or send before trying again, in seconds.
ERROR_BACKOFF_S = 1.0


class NatsBridge:
    """The bridge loop, runnable in-process (tests) or from ``run`` (the CLI)."""

    def __init__(self, client: NatsClient, send: Send, *, settings: Settings) -> None:
        self.client = client
        self.send = send
        self.settings = settings
        self.forwarded = 0
        self.dropped = 0
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def run(self) -> int:
        """Connect, subscribe, forward until stopped; 0 on a clean stop."""
        subscription = await self._subscribe()
        if subscription is None:
            return 0
        self.ready.set()
        logger.info("NATS bridge ready (jetstream=%s)", self.client.jetstream)
        try:
            while not self.stopping:
                try:
                    batch = await subscription.fetch(
                        self.settings.nats.bridge_fetch_batch,
                        self.settings.nats.bridge_fetch_timeout_s,
                    )
                except AppError as exc:
                    logger.warning("NATS fetch failed: %s", exc)
                    await self._pause()
                    continue
                if batch and not await self.forward(batch):
                    await self._pause()
        finally:
            await subscription.close()
            await self.client.drain()
        logger.info("NATS bridge stopped: %d forwarded, %d dropped", self.forwarded, self.dropped)
        return 0

    async def forward(self, batch: Sequence[IncomingMessage]) -> bool:
        """Send the batch's actor messages, then ack each sent one; False when sending failed."""
        limit = self.settings.recognition.max_message_bytes
        keep = [m for m in batch if len(m.data) <= limit]
        for message in batch:
            if len(message.data) > limit:
                self.dropped += 1
                logger.warning(
                    "Dropped recognition message on %s: %d bytes exceeds %d",
                    short_repr(message.subject),
                    len(message.data),
                    limit,
                )
                await message.ack()
        sent = await asyncio.to_thread(self._send_all, keep)
        for message in keep[:sent]:
            await message.ack()
        self.forwarded += sent
        return sent == len(keep)

    def _send_all(self, batch: Sequence[IncomingMessage]) -> int:
        for index, message in enumerate(batch):
            try:
                self.send(message.subject, base64.b64encode(message.data).decode(), message.headers)
            except Exception as exc:
                # NOTE: unacked messages stay with JetStream and come back after ack_wait.
                logger.warning("Enqueueing a recognition message failed: %s", type(exc).__name__)
                return index
        return len(batch)

    async def _subscribe(self) -> ResultSubscription | None:
        while not self.stopping:
            try:
                await self.client.connect()
                return await self.client.subscribe_results()
            except AppError as exc:
                logger.warning("NATS bridge cannot subscribe yet: %s", exc)
                await self.client.close()
                await self._pause()
        return None

    async def _pause(self) -> None:
        try:
            await asyncio.wait_for(self._stop.wait(), ERROR_BACKOFF_S)
        except TimeoutError:
            pass


def _send_to_inbox(subject: str, data: str, headers: dict[str, str]) -> object:
    return apply_recognition_message.send(subject, data, headers)


async def _main(settings: Settings) -> int:
    bridge = NatsBridge(
        NatsClient(settings.nats, name="mailroom-bridge"), _send_to_inbox, settings=settings
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, bridge.stop)
    return await bridge.run()


def run(settings: Settings) -> int:
    """Run the bridge until SIGTERM/SIGINT; the process exit code."""
    return asyncio.run(_main(settings))
