"""Dramatiq's Redis consumers woken when work arrives, instead of polling every 100 ms.

Dramatiq's Redis consumer polls: after a miss it sleeps up to the worker timeout and
fetches again. Every idle queue of every worker process then costs a script call per
poll (7 queues and their 7 delay queues at 100 ms: about 190 calls/s, a tenth of a core
per process), and a message waits for the next poll of its queue at every actor hop.

Here every enqueue also PUBLISHes on its queue's channel (``{namespace}:wakeups:{queue}``).
One thread per worker process listens on the channels of the queues it consumes, and
only those: a process is not woken by the traffic of queues it does not serve (with one
channel for all, every enqueue woke every worker process's listener). It wakes that
queue's consumer, which otherwise sleeps up to the worker timeout
(``broker.worker_poll_ms``) as a safety net: a wake-up that is lost (the listener
reconnecting or not subscribed yet, messages requeued by maintenance) costs at most
that wait, never the message. A consumer also wakes when a message of a full
prefetch is acked (there is room to fetch again) and when a delayed message it handed
to its thread becomes due (the thread releases due messages only between fetches).
"""

# Dramatiq's Redis consumer and redis-py's pubsub are untyped.
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import heapq
import logging
import threading
import time
import uuid
from typing import Any

import redis
from dramatiq.brokers.redis import _RedisConsumer
from dramatiq.common import current_millis
from dramatiq.errors import ConnectionClosed
from redis import Redis
from redis.exceptions import RedisError

from actors.broker.clock import RedisClockBroker
from actors.broker.failover import call_within
from actors.broker.replicated import ReplicaCount, enqueue_confirmed

logger = logging.getLogger(__name__)

#: Longest the listener blocks on its connection before it checks for a stop, in seconds.
LISTEN_TIMEOUT_S = 0.5
#: How often a waiting consumer checks that its thread still runs (no Redis call), in s.
STOP_CHECK_S = 0.25
#: Longest wait between the listener's attempts to subscribe again, in seconds.
MAX_RESUBSCRIBE_WAIT_S = 5.0


class WakeUps:
    """Per-queue events of one process, set by a listener thread from Redis channels."""

    def __init__(self, client: Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        #: This listener's own channel: a message on it ends the listener's current wait
        #: (a queue to subscribe, a stop). Queue names have no ``:``, so no queue's clashes.
        self.control = f"{prefix}:listener:{uuid.uuid4().hex}"
        self._events: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def channel(self, queue_name: str) -> str:
        """The channel enqueues on ``queue_name`` are announced on."""
        return f"{self.prefix}:{queue_name}"

    def event(self, queue_name: str) -> threading.Event:
        """The event set when work arrives on ``queue_name``; the listener subscribes it."""
        with self._lock:
            event = self._events.get(queue_name)
            if event is not None:
                return event
            event = self._events[queue_name] = threading.Event()
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._listen, name="dramatiq-wakeups", daemon=True
                )
                self._thread.start()
                return event
        self._interrupt()  # the running listener subscribes the new queue's channel now
        return event

    def announce(self, queue_name: str) -> None:
        """Tell every process's consumers of ``queue_name`` that it has work."""
        try:
            self.client.publish(self.channel(queue_name), "")
        except RedisError as exc:
            # The message is enqueued: raising would make its sender send it again.
            # Consumers find it at their next safety poll.
            logger.debug("Wake-up for queue %s not sent: %s", queue_name, exc)

    def _interrupt(self) -> None:
        try:
            self.client.publish(self.control, "")
        except RedisError:
            pass  # the listener subscribes at its next wait's end anyway

    def wake(self, queue_name: str) -> None:
        event = self._events.get(queue_name)
        if event is not None:
            event.set()

    def wake_all(self) -> None:
        for event in list(self._events.values()):
            event.set()

    def close(self) -> None:
        """Stop the listener and close its connection (waits at most a listen timeout)."""
        with self._lock:
            self._stop.set()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            self._interrupt()  # ends the listener's current wait for a message
            thread.join(timeout=LISTEN_TIMEOUT_S * 4)

    def _channels(self) -> set[str]:
        with self._lock:
            return {self.channel(queue_name) for queue_name in self._events}

    def _listen(self) -> None:
        failures = 0
        queue_of = len(self.prefix) + 1
        while not self._stop.is_set():
            pubsub = self.client.pubsub()
            try:
                pubsub.subscribe(self.control)
                subscribed: set[str] = set()
                while not self._stop.is_set():
                    wanted = self._channels()
                    if wanted - subscribed:
                        pubsub.subscribe(*(wanted - subscribed))
                        subscribed |= wanted
                    message = pubsub.get_message(timeout=LISTEN_TIMEOUT_S)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        # (Re)subscribed: what was announced meanwhile was not heard.
                        failures = 0
                        self.wake_all()
                    elif message["type"] == "message":
                        self.wake(_text(message["channel"])[queue_of:])
            except (RedisError, OSError) as exc:
                failures += 1
                wait_s = min(0.1 * 2**failures, MAX_RESUBSCRIBE_WAIT_S)
                logger.debug("Wake-up listener lost Redis (%s); again in %.1f s", exc, wait_s)
                self.wake_all()
                self._stop.wait(wait_s)
            finally:
                try:
                    pubsub.close()
                except (RedisError, OSError):
                    pass


def _text(data: Any) -> str:
    return data.decode() if isinstance(data, bytes) else str(data)


class WakingConsumer(_RedisConsumer):
    """A Redis consumer that waits on its queue's wake-up event after a miss."""

    def __init__(
        self,
        broker: WakingRedisBroker,
        queue_name: str,
        prefetch: int,
        timeout: int,
        wake: threading.Event,
    ) -> None:
        # Dramatiq's own back-off sleep after a miss is capped at 0 ms: this class waits.
        super().__init__(broker, queue_name, prefetch, 0)
        self.idle_s = timeout / 1000
        self.wake = wake
        self._waiting_for_room = False
        #: Etas of delayed messages handed to the consumer thread, earliest first (ms).
        self._etas: list[int] = []
        self._returned_at_ms = 0

    def __next__(self) -> Any:
        # The thread released every message due when this consumer last returned.
        while self._etas and self._etas[0] <= self._returned_at_ms:
            heapq.heappop(self._etas)
        if not self.message_cache:
            # Cleared before the fetch and the count, so a wake-up for work that arrives,
            # or for room made, after them is kept.
            self.wake.clear()
            self._waiting_for_room = self.outstanding_message_count >= self.prefetch
            self._fetch()
        # With the cache filled, Dramatiq's own ``__next__`` only decodes the next message.
        message = super().__next__() if self.message_cache else None
        if message is None:
            self.misses += 1  # as Dramatiq counts them
            self._wait(self._wait_s())
        elif message.options.get("eta") is not None:
            heapq.heappush(self._etas, int(message.options["eta"]))
        self._returned_at_ms = current_millis()
        return message

    def _fetch(self) -> None:
        """Fill the cache with up to the room left. Dramatiq's ``__next__`` would fetch too,
        but after a miss it sleeps (0 ms here), giving up the GIL and waiting to take it
        back from the busy threads, at every miss of every queue."""
        room = self.prefetch - self.outstanding_message_count
        if room <= 0:
            return
        try:
            self.message_cache = self.broker.do_fetch(self.queue_name, room)
        except redis.ConnectionError as exc:
            raise ConnectionClosed(exc) from None

    def _wait(self, wait_s: float) -> None:
        """Until woken or ``wait_s`` passed, or the consumer thread was told to stop."""
        deadline = time.monotonic() + wait_s
        thread = threading.current_thread()
        while not self.wake.wait(min(STOP_CHECK_S, max(0.0, deadline - time.monotonic()))):
            # Dramatiq's ``ConsumerThread.stop`` only clears ``running``.
            if time.monotonic() >= deadline or not getattr(thread, "running", True):
                return

    def _wait_s(self) -> float:
        if not self._etas:
            return self.idle_s
        due_in_s = (self._etas[0] - current_millis()) / 1000
        return max(0.0, min(self.idle_s, due_in_s))

    def ack(self, message: Any) -> None:
        try:
            super().ack(message)
        finally:
            self._made_room()

    def nack(self, message: Any) -> None:
        try:
            super().nack(message)
        finally:
            self._made_room()

    def requeue(self, messages: Any) -> None:
        messages = list(messages)
        super().requeue(messages)
        if messages:
            # Back on the queue for another consumer (this one is closing).
            self.broker.wakeups.announce(self.queue_name)

    def _made_room(self) -> None:
        if self._waiting_for_room:
            self.wake.set()


class WakingRedisBroker(RedisClockBroker):
    """``RedisClockBroker`` whose enqueues wake the consumers of their queue."""

    def __init__(
        self, *, send_retry_s: float = 0.0, replica_wait_ms: int = 1_000, **options: Any
    ) -> None:
        super().__init__(**options)
        self.wakeups = WakeUps(self.client, f"{self.namespace}:wakeups")
        #: How long an enqueue is tried again through a failover, in seconds (``failover``).
        self.send_retry_s = send_retry_s
        #: Longest wait for a replica's confirmation, in milliseconds (``replicated``).
        self.replica_wait_ms = replica_wait_ms
        self.replicas = ReplicaCount(self.client)

    def enqueue_confirmed(self, message: Any) -> Any:
        """``enqueue``, returning once a replica has the message when Redis has replicas."""
        return enqueue_confirmed(self, message, wait_ms=self.replica_wait_ms)

    def do_enqueue(self, queue_name: str, message_id: str, data: bytes) -> Any:
        """Dramatiq's enqueue script, tried again through a Redis failover."""
        dispatch = self._dispatch("enqueue")
        return call_within(self.send_retry_s, lambda: dispatch(queue_name, message_id, data))

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> WakingConsumer:
        return WakingConsumer(self, queue_name, prefetch, timeout, self.wakeups.event(queue_name))

    def enqueue(self, message: Any, *, delay: int | None = None) -> Any:
        enqueued = super().enqueue(message, delay=delay)
        # The queue it went to: a delayed message goes to the delay queue.
        self.wakeups.announce(enqueued.queue_name)
        return enqueued

    def close(self) -> None:
        self.wakeups.close()
        super().close()
