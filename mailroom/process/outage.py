"""One line per change of a server's reachability, in every long-running process.

A process that cannot reach a server it needs retries, often every second or
faster; logging each failure (with its traceback) buries the one fact that matters.
``OutageLog`` says it once when the outage starts (ERROR, naming the server with
its password masked), at most once per back-off step while it lasts (4 s, 8 s, …
up to ``max_interval_s``), and once when it ends (WARNING). An outage is expected:
its lines carry no traceback unless ``mailroom --debug`` asked for them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from mailroom.backoff import backoff
from mailroom.redaction import mask_urls

#: Set by ``mailroom --debug``: outage lines carry the failure's traceback.
show_tracebacks = False
#: Longest silence between two reports of one outage, in seconds.
MAX_REPORT_INTERVAL_S = 300.0
#: The first silence is ``2 ** FIRST_STEP`` seconds; each report doubles it.
FIRST_STEP = 2


class OutageLog:
    """Says once per back-off step that ``server`` is unreachable, and once that it is back.

    Thread-safe: a process's threads may report into one object.
    """

    def __init__(
        self,
        server: str,
        *,
        logger: logging.Logger,
        doing: str = "retrying",
        max_interval_s: float = MAX_REPORT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # Masked here too: a caller's server name or error may carry a URL with its login.
        self.server = mask_urls(server)
        self.logger = logger
        self.doing = doing
        self.max_interval_s = max_interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._reports = 0
        self._quiet_until: float | None = None

    @property
    def down(self) -> bool:
        return self._quiet_until is not None

    def failed(self, error: object, *, exc: BaseException | None = None) -> bool:
        """Note a failed call; log it unless this outage was reported recently. True if logged."""
        with self._lock:
            now = self.clock()
            if self._quiet_until is not None and now < self._quiet_until:
                return False
            wait_s = backoff(self._reports + FIRST_STEP, base=1, cap=self.max_interval_s)
            self._reports += 1
            self._quiet_until = now + wait_s
        self.logger.error(
            "%s is unreachable (%s); %s, next report in %.0f s",
            self.server,
            mask_urls(str(error)),
            self.doing,
            wait_s,
            exc_info=exc if show_tracebacks and exc is not None else None,
        )
        return True

    def recovered(self) -> bool:
        """Note a successful call; log once if an outage was reported. True if logged."""
        with self._lock:
            if self._quiet_until is None:
                return False
            self._reports, self._quiet_until = 0, None
        self.logger.warning("%s is reachable again", self.server)
        return True


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


def describe_redis_pool(pool: Any) -> str:
    """Where a redis-py pool's connections go: its URL, or its Sentinel master and sentinels."""
    from mailroom.adapters.redis_client import is_sentinel_pool, sentinels_of

    if is_sentinel_pool(pool):
        db = pool.connection_kwargs.get("db", 0)
        sentinels = ",".join(sentinels_of(pool))
        return f"redis sentinel master {pool.service_name} db {db} (sentinels {sentinels})"
    return describe_redis(pool.connection_kwargs)
