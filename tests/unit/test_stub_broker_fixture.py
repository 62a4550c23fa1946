"""The test harness's StubBroker starts each test with no message counted as in flight."""

from __future__ import annotations

import dramatiq
from dramatiq.brokers.stub import StubBroker

from tests.conftest import forget_taken_messages


def test_a_message_taken_by_a_stopped_worker_does_not_hold_up_a_later_join():
    stub = StubBroker()

    @dramatiq.actor(broker=stub, queue_name="leftover")
    def leftover() -> None:
        pass

    # A consumer took the message, and its worker stopped before running it
    leftover.send()
    consumer = stub.consume("leftover", prefetch=1, timeout=100)
    assert next(consumer) is not None
    consumer.close()
    stub.flush_all()
    assert stub.queues["leftover"].unfinished_tasks == 1  # join would wait for it forever

    forget_taken_messages(stub)

    stub.join("leftover", timeout=1_000)  # returns at once
