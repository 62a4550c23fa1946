"""Enqueues that ride a Redis failover: tried again for a bounded time, then raised.

The broker's client retries a command once (``transport.py`` says why), which replaces a
connection a restart killed but not the seconds Sentinel takes to promote a replica
(2 to 5 s with ``down-after-milliseconds 1000``). A send is retried here, with the
same Redis message id, until ``broker.send_retry_s`` has passed; then its caller sees the
error as before. A retried enqueue whose first reply was lost may leave the message twice
in its queue: every actor is idempotent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from redis.exceptions import ConnectionError, TimeoutError

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: First wait before a failed enqueue is tried again, in seconds; doubled per try.
FIRST_WAIT_S = 0.05
#: Longest wait between two tries, in seconds.
MAX_WAIT_S = 1.0


def call_within(budget_s: float, call: Callable[[], T]) -> T:
    """``call()``, tried again on a connection error or timeout until ``budget_s`` passed."""
    deadline = time.monotonic() + budget_s
    wait_s = FIRST_WAIT_S
    while True:
        try:
            return call()
        except (ConnectionError, TimeoutError) as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            logger.debug("Enqueue failed (%s); trying again", type(exc).__name__)
            time.sleep(min(wait_s, left))
            wait_s = min(2 * wait_s, MAX_WAIT_S)
