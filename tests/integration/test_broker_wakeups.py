"""Consumers woken by enqueues (``actors/broker/wakeups.py``) on a real Redis.

Each consumer here waits a minute when idle, so a test that gets its message
back within the join timeout was woken, not polled.
"""

from __future__ import annotations

import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from dramatiq import Message
from dramatiq.brokers import redis as dramatiq_redis

from actors.broker.wakeups import WakingRedisBroker

pytestmark = pytest.mark.integration

#: Idle wait of the consumers under test: far longer than any test waits, in ms.
IDLE_MS = 60_000
#: Generous bound for a woken consumer to return, in seconds (not a timing assertion).
WOKEN_WITHIN_S = 15
QUEUE = "woken"


@pytest.fixture
def brokers(redis_url):
    """Two processes' brokers on one namespace: one consumes, one sends."""
    namespace = f"wake-{uuid.uuid4().hex[:8]}"
    made = [WakingRedisBroker(url=redis_url, namespace=namespace) for _ in range(2)]
    for broker in made:
        broker.declare_queue(QUEUE)
    yield made
    for broker in made:
        broker.close()
        broker.client.close()


def _message(queue_name: str = QUEUE) -> Message[Any]:
    return Message(queue_name=queue_name, actor_name="probe", args=(), kwargs={}, options={})


def _next_in_thread(consumer: Any) -> tuple[threading.Thread, list[Any]]:
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(next(consumer)), daemon=True)
    thread.start()
    return thread, got


def _until(condition: Any, failure: str) -> None:
    deadline = time.monotonic() + WOKEN_WITHIN_S
    while not condition():
        assert time.monotonic() < deadline, failure
        time.sleep(0.01)


def _listening(broker: WakingRedisBroker) -> None:
    """Wait until the broker's listener has subscribed (a publish before that is unheard)."""
    channel = broker.wakeups.channel(QUEUE)
    _until(
        lambda: broker.client.pubsub_numsub(channel)[0][1] >= 1,
        "the wake-up listener never subscribed",
    )


def test_an_idle_consumer_is_woken_by_another_process_enqueue(brokers):
    worker, sender = brokers
    consumer = worker.consume(QUEUE, prefetch=1, timeout=IDLE_MS)
    _listening(worker)
    thread, got = _next_in_thread(consumer)
    _until(lambda: consumer.misses >= 1, "the consumer never missed")  # now in its idle wait

    sender.enqueue(_message())

    thread.join(WOKEN_WITHIN_S)
    assert not thread.is_alive(), "the consumer slept through the enqueue"
    assert got == [None]  # woken: the fetch that follows takes the message
    assert next(consumer).actor_name == "probe"


def test_a_miss_waits_on_the_wake_up_alone_without_dramatiqs_back_off_sleep(brokers, monkeypatch):
    worker, sender = brokers
    consumer = worker.consume(QUEUE, prefetch=2, timeout=1)  # a 1 ms idle wait
    sleeps: list[float] = []
    monkeypatch.setattr(dramatiq_redis, "time", SimpleNamespace(sleep=sleeps.append))

    assert next(consumer) is None and consumer.misses == 1
    sender.enqueue(_message())
    assert next(consumer).actor_name == "probe"

    assert sleeps == [], "a sleep(0) gives up the GIL and waits to take it back, per miss"


def test_a_full_prefetch_is_woken_when_a_message_is_acked(brokers):
    worker, sender = brokers
    consumer = worker.consume(QUEUE, prefetch=1, timeout=IDLE_MS)
    sender.enqueue(_message())
    held = next(consumer)
    assert held is not None
    thread, _ = _next_in_thread(consumer)
    _until(lambda: consumer._waiting_for_room, "the consumer never waited for room")

    consumer.ack(held)

    thread.join(WOKEN_WITHIN_S)
    assert not thread.is_alive(), "an ack with a full prefetch did not wake the consumer"


def test_a_delayed_message_handed_out_shortens_the_idle_wait_to_its_eta(brokers):
    worker, sender = brokers
    delay_queue = f"{QUEUE}.DQ"
    consumer = worker.consume(delay_queue, prefetch=10, timeout=IDLE_MS)
    sender.enqueue(_message(), delay=30_000)

    delayed = next(consumer)

    assert delayed is not None and delayed.options["eta"] > 0
    assert 0 < consumer._wait_s() <= 30.0 < IDLE_MS / 1000


def test_the_listener_resubscribes_after_its_connection_is_killed(brokers):
    worker, sender = brokers
    consumer = worker.consume(QUEUE, prefetch=1, timeout=IDLE_MS)
    _listening(worker)
    killed = sender.client.client_kill_filter(_type="pubsub")
    assert killed >= 1
    _listening(worker)
    consumer.wake.clear()

    sender.enqueue(_message())

    assert consumer.wake.wait(WOKEN_WITHIN_S), "no wake-up after the listener reconnected"


def test_closing_the_broker_stops_its_listener(brokers):
    worker, _ = brokers
    worker.consume(QUEUE, prefetch=1, timeout=IDLE_MS)
    listener = worker.wakeups._thread
    assert listener is not None and listener.is_alive()

    worker.close()

    assert not listener.is_alive()
    channels = [worker.wakeups.channel(QUEUE), worker.wakeups.control]
    # Redis drops the subscriptions once it reads the closed connection's end.
    _until(
        lambda: [n for _, n in worker.client.pubsub_numsub(*channels)] == [0, 0],
        "the closed listener's subscriptions are still there",
    )


def test_a_process_listens_only_to_the_queues_it_consumes(brokers):
    worker, sender = brokers
    sender.declare_queue("other")
    consumer = worker.consume(QUEUE, prefetch=1, timeout=IDLE_MS)
    _listening(worker)
    heard: list[str] = []
    wake = worker.wakeups.wake
    worker.wakeups.wake = lambda queue_name: (heard.append(queue_name), wake(queue_name))

    for _ in range(3):  # another queue's traffic: this process's listener never hears it
        sender.enqueue(_message("other"))
    consumer.wake.clear()
    sender.enqueue(_message())

    assert consumer.wake.wait(WOKEN_WITHIN_S), "no wake-up for the consumed queue"
    assert heard == [QUEUE]
    assert worker.client.pubsub_numsub(worker.wakeups.channel("other"))[0][1] == 0


def test_a_queue_consumed_after_the_listener_started_is_subscribed_at_once(brokers):
    worker, sender = brokers
    worker.consume(QUEUE, prefetch=1, timeout=IDLE_MS)
    _listening(worker)
    sender.declare_queue("later")
    worker.declare_queue("later")

    later = worker.consume("later", prefetch=1, timeout=IDLE_MS)

    _until(
        lambda: worker.client.pubsub_numsub(worker.wakeups.channel("later"))[0][1] >= 1,
        "the queue consumed later was never subscribed",
    )
    later.wake.clear()
    sender.enqueue(_message("later"))
    assert later.wake.wait(WOKEN_WITHIN_S), "no wake-up for the queue consumed later"
