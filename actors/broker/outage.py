"""One clear line per back-off step while a worker cannot reach its Redis broker.

Without this, each of Dramatiq's consumer threads (one per queue and delay queue)
logs a CRITICAL line and a restart line every 3 s while Redis is down (about
1,700 lines in 90 s for two processes), and none says which server it wanted.
``OutageReport`` turns every failure a worker process sees into one ERROR line
naming the broker (password masked), then stays quiet for a growing back-off;
``ConsumerErrorFilter`` hands it the consumer threads' connection errors.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from mailroom.intake.cursor_failures import backoff_s

logger = logging.getLogger(__name__)

#: Longest silence between two reports of one outage, in seconds.
MAX_REPORT_INTERVAL_S = 300.0
#: The first silence is ``2 ** FIRST_STEP`` seconds; each report doubles it.
FIRST_STEP = 2

# Dramatiq's ConsumerThread messages (worker.py), matched on the format string;
# dramatiq is pinned below 3.
_CONNECTION_ERROR = "Consumer encountered a connection error: %s"
_RESTARTING = "Restarting consumer in %0.2f seconds."


def describe_redis_pool(pool: Any) -> str:
    """Where a redis-py pool's connections go: its URL, or its Sentinel master and sentinels."""
    from mailroom.adapters.redis_client import is_sentinel_pool, sentinels_of

    if is_sentinel_pool(pool):
        db = pool.connection_kwargs.get("db", 0)
        sentinels = ",".join(sentinels_of(pool))
        return f"redis sentinel master {pool.service_name} db {db} (sentinels {sentinels})"
    return describe_redis(pool.connection_kwargs)


def describe_redis(connection_kwargs: dict[str, Any]) -> str:
    """``redis://user:***@host:port/db`` from a redis-py pool's connection kwargs."""
    user = connection_kwargs.get("username") or ""
    if connection_kwargs.get("password"):
        user = f"{user}:***@"
    elif user:
        user = f"{user}@"
    if connection_kwargs.get("path"):  # a unix socket
        return f"unix://{user}{connection_kwargs['path']}"
    host = connection_kwargs.get("host", "localhost")
    port = connection_kwargs.get("port", 6379)
    return f"redis://{user}{host}:{port}/{connection_kwargs.get('db', 0)}"


class OutageReport:
    """Says once per back-off step that the broker is unreachable, and once that it is back.

    Thread-safe: consumer threads and the maintenance thread report into one object.
    """

    def __init__(
        self,
        where: str,
        *,
        max_interval_s: float = MAX_REPORT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.where = where
        self.max_interval_s = max_interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._reports = 0
        self._quiet_until: float | None = None

    @property
    def down(self) -> bool:
        return self._quiet_until is not None

    def failed(self, error: object) -> None:
        """Note a failed broker call; log it unless this outage was reported recently."""
        with self._lock:
            now = self.clock()
            if self._quiet_until is not None and now < self._quiet_until:
                return
            wait_s = backoff_s(self._reports + FIRST_STEP, max_backoff_s=self.max_interval_s)
            self._reports += 1
            self._quiet_until = now + wait_s
        logger.error(
            "Broker %s is unreachable (%s); consumers keep retrying, next report in %.0f s",
            self.where,
            error,
            wait_s,
        )

    def recovered(self) -> None:
        """Note a successful broker call; log once if an outage was reported."""
        with self._lock:
            if self._quiet_until is None:
                return
            self._reports, self._quiet_until = 0, None
        logger.warning("Broker %s is reachable again", self.where)


class ConsumerErrorFilter(logging.Filter):
    """On one consumer thread's logger: its connection errors go to ``report`` instead.

    Each consumer thread has its own logger and so its own filter; only that thread
    logs through it, so ``_after_error`` needs no lock.
    """

    def __init__(self, report: OutageReport) -> None:
        super().__init__()
        self.report = report
        self._after_error = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == _CONNECTION_ERROR:
            self.report.failed(record.args[0] if isinstance(record.args, tuple) else record.args)
            self._after_error = True
            return False
        if record.msg == _RESTARTING and self._after_error:
            self._after_error = False
            return False
        self._after_error = False
        return True
