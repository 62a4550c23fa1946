"""Actors for fault tests, loaded by real ``dramatiq`` worker processes.

The probe records each start in Redis and then works for a long time, so a test
can kill its worker mid-message and watch another worker pick the message up.
"""

from __future__ import annotations

import os
import time

import dramatiq
import redis

import actors  # noqa: F401  (builds the real broker from MAILROOM_* settings)
from actors.retry_policy import RetryPolicy

PROBE_QUEUE = "faults_probe"


@dramatiq.actor(queue_name=PROBE_QUEUE, retry_policy=RetryPolicy(max_attempts=1))
def record_and_work(key: str, work_s: float) -> None:
    """Append this process' pid to ``key``, then work for ``work_s`` seconds."""
    client = redis.Redis.from_url(os.environ["MAILROOM_REDIS__URL"])
    try:
        client.rpush(key, f"{os.getpid()}:{time.time()}")
    finally:
        client.close()
    time.sleep(work_s)
