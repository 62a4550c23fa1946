"""Stream bridge: the delivery Redis Stream's consumer group → ``deliver_channel_message``.

Each pass: claim entries idle longer than ``claim_idle_ms`` from dead bridges
(XAUTOCLAIM, every ``claim_interval_ms``), then re-read this consumer's own
pending entries, then block for new ones. An entry is acknowledged (and
deleted) only after its actor message was sent, so a bridge killed in between
leaves it pending and another bridge claims it; the delivery actor's delivered
fast path makes the duplicate harmless. Malformed entries are acknowledged and
counted. Redis going away is survived by reconnecting with backoff.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from mailroom.adapters.redis import CONNECTION_ERRORS
from mailroom.delivery import metrics
from mailroom.delivery.contracts import decode_entry
from mailroom.settings import DeliverySettings, Settings

logger = logging.getLogger(__name__)

#: First wait before reconnecting or re-sending after a failure, in seconds.
INITIAL_BACKOFF_S = 0.1

Entry = tuple[Any, dict[Any, Any]]


def consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class StreamBridge:
    """The consumer loop, testable in-process: ``await run()`` until ``stop`` is set.

    ``send(message_id)`` enqueues the actor message; it may block (Dramatiq's
    ``actor.send``), so a batch is sent on a worker thread.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        settings: DeliverySettings,
        send: Callable[[int], object],
        consumer: str | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.send = send
        self.consumer = consumer or consumer_name()
        self.stop = stop or asyncio.Event()
        self.forwarded = 0
        self.malformed = 0
        self.outages = 0
        self._own_pending = True
        self._backoff_s = INITIAL_BACKOFF_S

    async def run(self) -> None:
        """Consume until ``stop`` is set; Redis outages are waited out with backoff."""
        logger.info(
            "Stream bridge %s consuming %s (group %s)",
            self.consumer,
            self.settings.stream_key,
            self.settings.consumer_group,
        )
        while not self.stop.is_set():
            try:
                await self.ensure_group()
                await self._consume()
            except CONNECTION_ERRORS as exc:
                self.outages += 1
                await self._wait_after_failure(f"Redis unavailable: {type(exc).__name__}: {exc}")
            except redis.exceptions.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                # The stream or group vanished (Redis lost its data): create it again.
                await self._wait_after_failure(f"consumer group missing: {exc}")
        logger.info(
            "Stream bridge %s stopped (%d forwarded, %d malformed)",
            self.consumer,
            self.forwarded,
            self.malformed,
        )

    async def ensure_group(self) -> None:
        try:
            await self.client.xgroup_create(
                self.settings.stream_key, self.settings.consumer_group, id="0", mkstream=True
            )
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _consume(self) -> None:
        self._own_pending = True  # after (re)connecting, our unacknowledged entries come first
        next_claim = 0.0
        while not self.stop.is_set():
            if time.monotonic() >= next_claim:
                await self._claim_from_dead_consumers()
                next_claim = time.monotonic() + self.settings.claim_interval_ms / 1000
                continue
            if self._own_pending:
                entries = await self._read("0", block_ms=None)
                self._backoff_s = INITIAL_BACKOFF_S
                if not entries:
                    self._own_pending = False
                    continue
            else:
                entries = await self._read(">", block_ms=self.settings.read_block_ms)
                self._backoff_s = INITIAL_BACKOFF_S
            if entries and not await self.handle(entries):
                self._own_pending = True
                await self._wait_after_failure("sending to the broker failed; entries stay pending")

    async def _claim_from_dead_consumers(self) -> None:
        start: Any = "0-0"
        while not self.stop.is_set():
            reply = await self.client.xautoclaim(
                self.settings.stream_key,
                self.settings.consumer_group,
                self.consumer,
                min_idle_time=self.settings.claim_idle_ms,
                start_id=start,
                count=self.settings.read_count,
            )
            start, claimed = reply[0], reply[1]
            if claimed:
                logger.warning(
                    "Claimed %d stream entries idle for over %d ms",
                    len(claimed),
                    self.settings.claim_idle_ms,
                )
                if not await self.handle(claimed):
                    self._own_pending = True
                    return
            if start in (b"0-0", "0-0"):
                return

    async def _read(self, start: str, *, block_ms: int | None) -> list[Entry]:
        reply: Any = await self.client.xreadgroup(
            self.settings.consumer_group,
            self.consumer,
            {self.settings.stream_key: start},
            count=self.settings.read_count,
            block=block_ms,
        )
        if not reply:
            return []
        return [entry for _, entries in reply for entry in entries]

    async def handle(self, entries: Sequence[Entry]) -> bool:
        """Forward a batch; True when every entry was acknowledged."""
        done: list[Any] = []
        to_send: list[tuple[Any, int]] = []
        for entry_id, fields in entries:
            message_id = decode_entry(fields) if fields else None
            if message_id is None:
                done.append(entry_id)
                self.malformed += 1
                metrics.STREAM_ENTRIES.labels("malformed").inc()
                logger.warning("Malformed delivery stream entry %r acknowledged", entry_id)
            else:
                to_send.append((entry_id, message_id))
        sent, error = (
            await asyncio.to_thread(self._send_all, [mid for _, mid in to_send])
            if to_send
            else (0, None)
        )
        done.extend(entry_id for entry_id, _ in to_send[:sent])
        await self._ack(done)
        self.forwarded += sent
        if sent:
            metrics.STREAM_ENTRIES.labels("forwarded").inc(sent)
        if error is not None:
            logger.warning(
                "Sending delivery message %s failed: %s: %s",
                to_send[sent][1],
                type(error).__name__,
                str(error)[:200],
            )
            return False
        return True

    def _send_all(self, message_ids: list[int]) -> tuple[int, BaseException | None]:
        for index, message_id in enumerate(message_ids):
            try:
                self.send(message_id)
            except Exception as exc:
                return index, exc
        return len(message_ids), None

    async def _ack(self, entry_ids: list[Any]) -> None:
        if not entry_ids:
            return
        pipe = self.client.pipeline(transaction=False)
        pipe.xack(self.settings.stream_key, self.settings.consumer_group, *entry_ids)
        # Acknowledged entries are done: trim them so the stream holds only the backlog.
        pipe.xdel(self.settings.stream_key, *entry_ids)
        await pipe.execute()

    async def _wait_after_failure(self, reason: str) -> None:
        delay = self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, self.settings.reconnect_max_backoff_s)
        logger.warning("Stream bridge %s: %s; retrying in %.1f s", self.consumer, reason, delay)
        try:
            await asyncio.wait_for(self.stop.wait(), delay)
        except TimeoutError:
            pass


def create_client(url: str, settings: DeliverySettings) -> aioredis.Redis:
    """A client whose reads outlast the blocking XREADGROUP."""
    return aioredis.Redis.from_url(
        url,
        socket_connect_timeout=2.0,
        socket_timeout=settings.read_block_ms / 1000 + 5.0,
    )


async def serve(settings: Settings, send: Callable[[int], object]) -> int:
    """Run the bridge until SIGTERM or SIGINT: stop reading, finish the batch, exit 0."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    client = create_client(settings.redis.url, settings.delivery)
    try:
        await StreamBridge(client, settings=settings.delivery, send=send, stop=stop).run()
    finally:
        await client.aclose()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    return 0


def run(settings: Settings) -> int:
    """Entry point of ``mailroom bridge stream``."""
    import dramatiq

    from actors.delivery import deliver_channel_message  # builds the broker from the environment
    from mailroom.observability import start_metrics_server

    start_metrics_server(settings)
    try:
        return asyncio.run(serve(settings, deliver_channel_message.send))
    finally:
        dramatiq.get_broker().close()
