"""Stream bridge: the delivery Redis Stream's consumer group → ``deliver_channel_messages``.

Each pass: claim entries idle longer than ``claim_idle_ms`` from dead bridges
(XAUTOCLAIM, every ``claim_interval_ms``, then delete consumers long idle with nothing
pending: ``stream_consumers``), then re-read this consumer's own
pending entries, then block for new ones. The ids of a read go out as one
actor message (a batch). An entry is acknowledged (and deleted) only after its
actor message was sent, so a bridge killed in between
leaves it pending and another bridge claims it; the delivery actor's delivered
fast path makes the duplicate harmless. Malformed entries are acknowledged and
counted. Redis going away is survived by reconnecting with backoff, and told
once when it starts, at most once per back-off step and once when it ends. A
Redis that refuses the login at the start is no outage: one line, exit 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from bridges.stream_consumers import IdleConsumers
from mailroom.adapters.redis import CONNECTION_ERRORS, READ_NEW_PACKED, unpack_entries
from mailroom.adapters.redis_client import async_client
from mailroom.backoff import backoff
from mailroom.delivery import metrics
from mailroom.delivery.contracts import PAYLOAD_FIELD, decode_payload
from mailroom.process.identity import host_pid
from mailroom.process.outage import OutageLog, describe_redis_pool
from mailroom.process.stop_signals import handle_stop_signals
from mailroom.settings import DeliverySettings, RedisSettings, Settings

logger = logging.getLogger(__name__)

#: Exit status when Redis refuses the credentials at the start (a configuration error).
EXIT_LOGIN_REFUSED = 2
#: First wait before reconnecting or re-sending after a failure, in seconds.
INITIAL_BACKOFF_S = 0.1

#: A stream entry as the bridge handles it: (entry id, payload field or None).
Entry = tuple[Any, bytes | str | None]


class StreamBridge:
    """The consumer loop, testable in-process: ``await run()`` until ``stop`` is set.

    ``send(message_ids)`` enqueues one actor message for the ids of a batch; it may
    block (Dramatiq's ``actor.send``), so it runs on a worker thread.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        settings: DeliverySettings,
        send: Callable[[list[int]], object],
        consumer: str | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.send = send
        self.consumer = consumer or host_pid()
        self.stop = stop or asyncio.Event()
        self.forwarded = 0
        self.malformed = 0
        self.outages = 0
        self._own_pending = True
        #: Forwarded entries whose acknowledgement rides on the next read of a backlog.
        self._unacked: list[Any] = []
        #: Failed passes in a row, for the backoff; a read that succeeds starts it over.
        self._failures = 0
        self._read_new_packed = client.register_script(READ_NEW_PACKED)
        self._idle_consumers = IdleConsumers(client, settings)
        self.outage = OutageLog(
            f"Stream bridge {self.consumer}: Redis {_describe(client)}",
            logger=logger,
            doing="the entries wait in the stream",
        )

    async def run(self) -> int:
        """Consume until ``stop`` is set; Redis outages are waited out with backoff.

        Returns 0, or ``EXIT_LOGIN_REFUSED`` when Redis refused the login before the
        bridge ever read (later refusals are an outage: a restarted Redis may lag its ACL).
        """
        started = False
        logger.info(
            "Stream bridge %s consuming %s (group %s)",
            self.consumer,
            self.settings.stream_key,
            self.settings.consumer_group,
        )
        while not self.stop.is_set():
            try:
                await self.ensure_group()
                started = True
                await self._consume()
            except redis.exceptions.AuthenticationError as exc:
                if not started:
                    logger.error(
                        "Stream bridge %s cannot start: Redis %s refused the login (%s); "
                        "check MAILROOM_REDIS__USERNAME and MAILROOM_REDIS__PASSWORD",
                        self.consumer,
                        _describe(self.client),
                        exc,
                    )
                    return EXIT_LOGIN_REFUSED
                self.outages += 1
                await self._wait_after_failure(f"Redis refused the login: {exc}")
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
        return 0

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
        self._unacked = []  # left over from a failure: still pending, so read again
        next_claim = 0.0
        # The next batch of a backlog, read while the current one is forwarded.
        ahead: asyncio.Future[Sequence[Entry]] | None = None
        try:
            while not self.stop.is_set():
                if time.monotonic() >= next_claim:
                    await self._flush_acks()
                    await self._claim_from_dead_consumers()
                    next_claim = time.monotonic() + self.settings.claim_interval_ms / 1000
                    continue
                backlog = False
                if self._own_pending:
                    if ahead is not None:
                        # Read ahead into our pending list, so the re-read below has them.
                        await ahead
                        ahead = None
                    await self._flush_acks()
                    entries = await self._read("0", block_ms=None)
                    self._failures = 0
                    self.outage.recovered()
                    if not entries:
                        self._own_pending = False
                        continue
                else:
                    if ahead is not None:
                        entries, ahead = await ahead, None
                    else:
                        entries = await self._read(">", block_ms=self.settings.read_block_ms)
                    self._failures = 0
                    self.outage.recovered()
                    backlog = len(entries) >= self.settings.read_count
                    if backlog:
                        # One round trip acknowledges the batch forwarded last and reads the
                        # next one, while this one is forwarded.
                        ahead = asyncio.ensure_future(self._read_packed(ack=self._take_unacked()))
                    else:
                        await self._flush_acks()
                if entries and not await self.handle(entries, defer_ack=backlog):
                    self._own_pending = True
                    await self._wait_after_failure(
                        "sending to the broker failed; entries stay pending"
                    )
            if ahead is not None:
                # Stopping: the batch read ahead is ours already; finish it as well.
                entries, ahead = await ahead, None
                if entries:
                    await self.handle(entries)
            await self._flush_acks()
        finally:
            if ahead is not None:
                # Failing: whatever it read stays pending and is read again after reconnecting.
                ahead.cancel()
                with contextlib.suppress(BaseException):
                    await ahead

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
            start, claimed = reply[0], _payloads(reply[1])
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
                break
        forgotten = await self._idle_consumers.forget(keep=self.consumer)
        if forgotten:
            logger.info("Deleted %d idle stream consumer(s): %s", len(forgotten), forgotten)

    async def _read(self, start: str, *, block_ms: int | None) -> Sequence[Entry]:
        if start == ">":
            # A backlog is read packed (cheap to parse); only an empty one waits blocking.
            entries = await self._read_packed()
            if entries or self._own_pending:
                return entries
        reply: Any = await self.client.xreadgroup(
            self.settings.consumer_group,
            self.consumer,
            {self.settings.stream_key: start},
            count=self.settings.read_count,
            block=block_ms,
        )
        if not reply:
            return []
        return [entry for _, entries in reply for entry in _payloads(entries)]

    async def _read_packed(self, *, ack: Sequence[Any] = ()) -> Sequence[Entry]:
        """New entries without blocking, in one packed reply (``READ_NEW_PACKED``).

        ``ack``: forwarded entries to acknowledge (and delete) in the same round trip.
        """
        packed = await self._read_new_packed(
            keys=[self.settings.stream_key],
            args=[self.settings.consumer_group, self.consumer, self.settings.read_count, *ack],
        )
        entries = unpack_entries(packed)
        if entries is None:
            # Now in our pending list: read them again plainly.
            self._own_pending = True
            return []
        return entries

    async def handle(self, entries: Sequence[Entry], *, defer_ack: bool = False) -> bool:
        """Forward a batch; True when every entry was forwarded (malformed ones dropped).

        Forwarded entries are acknowledged now, or with ``defer_ack`` by the next read
        (or ``_flush_acks``): either way only after their actor message was sent.
        """
        done: list[Any] = []
        to_send: list[tuple[Any, int]] = []
        for entry_id, payload in entries:
            message_id = decode_payload(payload)
            if message_id is None:
                done.append(entry_id)
                self.malformed += 1
                metrics.STREAM_ENTRIES.labels("malformed").inc()
                logger.warning("Malformed delivery stream entry %r acknowledged", entry_id)
            else:
                to_send.append((entry_id, message_id))
        ids = [message_id for _, message_id in to_send]
        error: BaseException | None = None
        if ids:
            try:
                await asyncio.to_thread(self.send, ids)
            except Exception as exc:
                error = exc
            else:
                done.extend(entry_id for entry_id, _ in to_send)
        if defer_ack:
            self._unacked.extend(done)
        else:
            await self._ack(done)
        if error is not None:
            logger.warning(
                "Sending delivery messages %s failed: %s: %s",
                ids[:20],
                type(error).__name__,
                str(error)[:200],
            )
            return False
        self.forwarded += len(ids)
        if ids:
            metrics.STREAM_ENTRIES.labels("forwarded").inc(len(ids))
        return True

    def _take_unacked(self) -> list[Any]:
        taken, self._unacked = self._unacked, []
        return taken

    async def _flush_acks(self) -> None:
        if self._unacked:
            await self._ack(self._take_unacked())

    async def _ack(self, entry_ids: list[Any]) -> None:
        if not entry_ids:
            return
        pipe = self.client.pipeline(transaction=False)
        pipe.xack(self.settings.stream_key, self.settings.consumer_group, *entry_ids)
        # Acknowledged entries are done: trim them so the stream holds only the backlog.
        pipe.xdel(self.settings.stream_key, *entry_ids)
        await pipe.execute()

    async def _wait_after_failure(self, reason: str) -> None:
        delay = backoff(
            self._failures, base=INITIAL_BACKOFF_S, cap=self.settings.reconnect_max_backoff_s
        )
        self._failures += 1
        self.outage.failed(reason)
        try:
            await asyncio.wait_for(self.stop.wait(), delay)
        except TimeoutError:
            pass


def _describe(client: aioredis.Redis) -> str:
    """Where ``client`` connects (URL or Sentinel master), the password masked."""
    return describe_redis_pool(client.connection_pool)


def _payloads(entries: Sequence[tuple[Any, Any]]) -> list[Entry]:
    """(entry id, payload) of plainly read entries (fields are None for deleted ones)."""
    found: list[Entry] = []
    for entry_id, fields in entries:
        payload = None
        if fields:
            payload = fields.get(PAYLOAD_FIELD.encode(), fields.get(PAYLOAD_FIELD))
        found.append((entry_id, payload))
    return found


def create_client(
    url: str, settings: DeliverySettings, redis_settings: RedisSettings | None = None
) -> aioredis.Redis:
    """A client whose reads outlast the blocking XREADGROUP."""
    return async_client(
        url, redis_settings or RedisSettings(), block_s=settings.read_block_ms / 1000
    )


async def serve(settings: Settings, send: Callable[[list[int]], object]) -> int:
    """Run the bridge until SIGTERM or SIGINT: stop reading, finish the batch, exit 0 (2 when
    Redis refused the login at the start)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    handle_stop_signals(lambda *_: loop.call_soon_threadsafe(stop.set))
    client = create_client(settings.stream_redis_url, settings.delivery, settings.stream_redis)
    try:
        return await StreamBridge(client, settings=settings.delivery, send=send, stop=stop).run()
    finally:
        await client.aclose()


def run(settings: Settings) -> int:
    """Entry point of ``mailroom bridge stream``."""
    from mailroom import queues as actor_names
    from mailroom.process.observability import start_metrics_server

    # Batches go to the delivery actor by name: this process loads no actor module.
    actor_names.only_send()
    from actors.broker.transport import send, set_sending_broker

    broker = set_sending_broker(settings)
    start_metrics_server(settings)
    try:
        return asyncio.run(serve(settings, partial(send, actor_names.DELIVER_CHANNEL_MESSAGES)))
    finally:
        broker.close()
