"""Dramatiq's Redis broker on Redis's clock instead of each process's own.

Dramatiq's dispatch script stamps every heartbeat with the caller's wall clock
and, during maintenance, takes workers whose last beat is older than
``heartbeat_timeout`` (by the maintaining process's clock) for dead and
requeues their unacked messages. A worker whose clock runs a minute ahead thus
requeues every other worker's in-flight messages on each maintenance pass (they
run twice at once), and a worker whose clock runs behind is never found dead.
Mailroom compares times across processes on one clock (ARCHITECTURE.md, One
clock): for the broker that clock is Redis's ``TIME``. Each process measures
its offset to it now and then and stamps every dispatch with the corrected time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from dramatiq.brokers.redis import RedisBroker
from redis import Redis

#: How long a measured offset to Redis's clock is used before it is measured again, in s.
RESYNC_S = 30.0


class RedisClock:
    """Milliseconds by Redis's ``TIME``, from this process's clock plus a measured offset."""

    def __init__(
        self,
        client: Redis,
        *,
        local_ms: Callable[[], float] | None = None,
        resync_s: float = RESYNC_S,
    ) -> None:
        self.client = client
        self.local_ms = local_ms or (lambda: time.time() * 1000)
        self.resync_s = resync_s
        self._offset_ms: float | None = None
        self._synced_at = 0.0
        self._lock = threading.Lock()

    def millis(self) -> int:
        if self._offset_ms is None or time.monotonic() - self._synced_at > self.resync_s:
            self.sync()
        assert self._offset_ms is not None
        return int(self.local_ms() + self._offset_ms)

    def sync(self) -> None:
        """Measure the offset: Redis's time against the middle of the round trip."""
        with self._lock:
            before = self.local_ms()
            seconds, micros = self.client.time()
            after = self.local_ms()
            server_ms = seconds * 1000 + micros / 1000
            self._offset_ms = server_ms - (before + after) / 2
            self._synced_at = time.monotonic()


class _StampedScript:
    """Dramatiq's dispatch script, with its timestamp argument taken from ``clock``."""

    #: Position of the timestamp in the dispatch script's arguments.
    TIMESTAMP = 1

    def __init__(self, script: Any, clock: RedisClock) -> None:
        self.script = script
        self.clock = clock

    def __call__(self, keys: list[Any], args: list[Any], **kwargs: Any) -> Any:
        args = list(args)
        args[self.TIMESTAMP] = self.clock.millis()
        return self.script(keys=keys, args=args, **kwargs)


class RedisClockBroker(RedisBroker):
    """A ``RedisBroker`` whose heartbeats and maintenance use Redis's clock."""

    def __init__(self, **options: Any) -> None:
        # Dramatiq leaves RedisBroker's constructor unannotated.
        super().__init__(**options)  # type: ignore[no-untyped-call]
        self.clock = RedisClock(self.client)
        self.scripts["dispatch"] = _StampedScript(self.scripts["dispatch"], self.clock)
