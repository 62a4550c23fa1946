"""Bounded redelivery on Dramatiq's Redis broker.

Dramatiq's Redis broker requeues a dead worker's unacked messages only during
"maintenance", which runs on a random ~0.1% of broker commands, and only for
workers silent for ``heartbeat_timeout`` (60 s by default). A worker also stops
beating while all its threads are busy and its prefetch is full. So each worker
process runs a small thread that, every ``interval_s``, beats for its broker
and forces maintenance on every queue it knows. A message of a kill -9'd worker
then runs again within ``heartbeat_timeout + interval_s`` (plus the fetch idle
backoff of the worker that picks it up).

The same thread is the process' judge of whether Redis is reachable: with the
consumer threads' connection errors it feeds one ``OutageReport``, which says so
once per back-off step (``actors.broker.outage``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from dramatiq import Broker, Middleware
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis, dq_name
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from actors.broker.outage import ConsumerErrorFilter, OutageReport, describe_redis_pool

logger = logging.getLogger(__name__)


def run_redis_maintenance(broker: RedisBroker, queues: set[str] | None = None) -> None:
    """Beat for ``broker`` and requeue dead workers' messages on ``queues`` (default: all)."""
    names = queues if queues is not None else broker.get_declared_queues()
    dispatch = broker.scripts["dispatch"]
    for queue in sorted(names | {dq_name(q) for q in names}):
        # The "qsize" command is read-only; argument 7 forces the maintenance branch.
        dispatch(
            args=[
                "qsize",
                current_millis(),
                queue,
                broker.broker_id,
                broker.heartbeat_timeout,
                broker.dead_message_ttl,
                1,
                broker._max_unpack_size(),  # type: ignore[no-untyped-call]
            ],
            keys=[broker.namespace],
        )


class RedisMaintenance(Middleware):
    """Heartbeat plus forced maintenance from every worker process."""

    def __init__(self, *, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.outage: OutageReport | None = None

    def before_worker_boot(self, broker: Broker, worker: Any) -> None:
        if isinstance(broker, RedisBroker):
            self.outage = OutageReport(describe_redis_pool(broker.client.connection_pool))

    def after_consumer_thread_boot(self, broker: Broker, thread: Any) -> None:
        if self.outage is not None:
            thread.logger.addFilter(ConsumerErrorFilter(self.outage))

    def after_worker_boot(self, broker: Broker, worker: Any) -> None:
        if not isinstance(broker, RedisBroker):
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(broker,), name="redis-maintenance", daemon=True
        )
        self._thread.start()

    def before_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s + 5)
            self._thread = None

    def _run(self, broker: RedisBroker) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                run_redis_maintenance(broker)
            except (RedisConnectionError, RedisTimeoutError) as exc:
                if self.outage is not None:
                    self.outage.failed(exc)
            except Exception as exc:  # keep beating: a missed beat requeues our messages
                logger.warning("Broker maintenance failed: %s", exc)
            else:
                if self.outage is not None:
                    self.outage.recovered()
