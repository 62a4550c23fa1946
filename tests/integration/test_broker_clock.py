"""Dramatiq's Redis broker on Redis's clock: a worker whose clock is ahead requeues nothing.

Maintenance takes a worker whose last heartbeat is older than the heartbeat
timeout for dead. With each process's own clock, a process two minutes ahead
judges every live worker dead and requeues its in-flight messages; on Redis's
clock (``actors/broker/clock.py``) it does not, and a worker that really stops
beating is still found dead.
"""

from __future__ import annotations

import time
import uuid

import pytest
from dramatiq import Message

from actors.broker.clock import RedisClockBroker
from actors.middleware.maintenance import run_redis_maintenance

pytestmark = pytest.mark.integration

HEARTBEAT_TIMEOUT_MS = 3_000
AHEAD_MS = 120_000
QUEUE = "clocked"


@pytest.fixture
def brokers(redis_url):
    namespace = f"clock-{uuid.uuid4().hex[:8]}"
    made = [
        RedisClockBroker(url=redis_url, namespace=namespace, heartbeat_timeout=HEARTBEAT_TIMEOUT_MS)
        for _ in range(2)
    ]
    for broker in made:
        broker.declare_queue(QUEUE)
    yield made
    for broker in made:
        broker.client.close()


def _in_flight(broker: RedisClockBroker) -> None:
    """``broker``'s worker holds one message: fetched, not acked (its heartbeat is now)."""
    message = Message(queue_name=QUEUE, actor_name="probe", args=(), kwargs={}, options={})
    broker.enqueue(message)
    assert len(broker.do_fetch(QUEUE, 1)) == 1


def _queued(broker: RedisClockBroker) -> int:
    return int(broker.client.llen(f"{broker.namespace}:{QUEUE}"))


def test_a_process_ahead_of_redis_requeues_no_live_workers_messages(brokers):
    worker, ahead = brokers
    _in_flight(worker)
    ahead.clock.local_ms = lambda: time.time() * 1000 + AHEAD_MS
    ahead.clock.sync()

    run_redis_maintenance(ahead, {QUEUE})

    assert _queued(worker) == 0, "the live worker keeps its message"


def test_without_the_redis_clock_the_same_process_would_requeue_it(brokers):
    # The defect the broker clock closes, shown with the raw script and a clock 2 min ahead.
    worker, ahead = brokers
    _in_flight(worker)
    raw_dispatch = ahead.scripts["dispatch"].script
    args = ["qsize", int(time.time() * 1000) + AHEAD_MS, QUEUE, ahead.broker_id]
    args += [ahead.heartbeat_timeout, ahead.dead_message_ttl, 1, ahead._max_unpack_size()]
    raw_dispatch(keys=[ahead.namespace], args=args)

    assert _queued(worker) == 1


def test_a_worker_that_stops_beating_is_still_found_dead(brokers):
    worker, other = brokers
    _in_flight(worker)
    time.sleep(HEARTBEAT_TIMEOUT_MS / 1000 + 0.5)

    run_redis_maintenance(other, {QUEUE})

    assert _queued(worker) == 1, "the silent worker's message runs again"
