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
from typing import Any

from mailroom.process.outage import (
    MAX_REPORT_INTERVAL_S,
    OutageLog,
    describe_redis,
    describe_redis_pool,
)

__all__ = ["ConsumerErrorFilter", "OutageReport", "describe_redis", "describe_redis_pool"]

logger = logging.getLogger(__name__)

# Dramatiq's ConsumerThread messages (worker.py), matched on the format string;
# dramatiq is pinned below 3.
_CONNECTION_ERROR = "Consumer encountered a connection error: %s"
_RESTARTING = "Restarting consumer in %0.2f seconds."


class OutageReport(OutageLog):
    """The broker's ``OutageLog``: consumer threads and the maintenance thread report into it."""

    def __init__(self, where: str, **options: Any) -> None:
        options.setdefault("max_interval_s", MAX_REPORT_INTERVAL_S)
        super().__init__(
            f"Broker {where}", logger=logger, doing="consumers keep retrying", **options
        )
        self.where = where


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
