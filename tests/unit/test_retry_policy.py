"""The retry-policy middleware: backoff, cap, jitter, permanent errors, retry-after, exhaustion."""

from __future__ import annotations

import random
import time

import dramatiq
import pytest

from actors.middleware.retry_policy import RetryPolicy
from mailroom.errors import PermanentError, RateLimited, RetryableError


def test_backoff_doubles_from_base_and_stops_at_cap():
    policy = RetryPolicy(base_ms=100, cap_ms=1_000, jitter=0)
    assert [policy.backoff_ms(n) for n in range(6)] == [100, 200, 400, 800, 1_000, 1_000]


def test_jitter_stays_within_half_the_delay():
    policy = RetryPolicy(base_ms=1_000, cap_ms=10_000, jitter=0.5)
    rng = random.Random(7)
    delays = [policy.backoff_ms(2, rng=rng) for _ in range(500)]
    assert min(delays) >= 4_000
    assert max(delays) <= 6_000
    assert len(set(delays)) > 100, "jitter should spread retries"


def test_retry_after_carried_by_the_error_wins_over_backoff():
    policy = RetryPolicy(base_ms=100, cap_ms=1_000, jitter=0)
    assert policy.delay_ms(0, RateLimited(retry_after_s=7.5)) == 7_500
    assert policy.delay_ms(0, dramatiq.Retry(delay=1234)) == 1234
    assert (
        RetryPolicy(retry_after=False, base_ms=100, jitter=0).delay_ms(
            0, RateLimited(retry_after_s=7.5)
        )
        == 100
    )


@pytest.fixture
def calls():
    return {"count": 0, "exhausted": []}


def _declare(broker, name, policy, calls, error):
    @dramatiq.actor(actor_name=name, broker=broker, queue_name=name, retry_policy=policy)
    def flaky() -> None:
        calls["count"] += 1
        raise error

    return flaky


def test_retryable_error_is_retried_until_attempts_run_out_then_hook_runs(
    stub_broker, stub_worker, calls
):
    policy = RetryPolicy(
        base_ms=1,
        cap_ms=5,
        jitter=0,
        max_attempts=4,
        on_exhausted=lambda message, exc: calls["exhausted"].append((message.message_id, exc)),
    )
    actor = _declare(stub_broker, "rp_retryable", policy, calls, RetryableError("try later"))
    message = actor.send()
    stub_broker.join(actor.queue_name, fail_fast=False)
    stub_worker.join()
    assert calls["count"] == 4
    assert [m for m, _ in calls["exhausted"]] == [message.message_id]
    assert isinstance(calls["exhausted"][0][1], RetryableError)
    assert len(stub_broker.dead_letters_by_queue[actor.queue_name]) == 1


def test_permanent_error_is_not_retried(stub_broker, stub_worker, calls):
    policy = RetryPolicy(base_ms=1, max_attempts=5)
    actor = _declare(stub_broker, "rp_permanent", policy, calls, PermanentError("bad payload"))
    actor.send()
    stub_broker.join(actor.queue_name, fail_fast=False)
    stub_worker.join()
    assert calls["count"] == 1
    assert len(stub_broker.dead_letters_by_queue[actor.queue_name]) == 1


def test_custom_permanent_types_are_honoured(stub_broker, stub_worker, calls):
    policy = RetryPolicy(base_ms=1, max_attempts=5, permanent=(KeyError,))
    actor = _declare(stub_broker, "rp_custom_permanent", policy, calls, KeyError("x"))
    actor.send()
    stub_broker.join(actor.queue_name, fail_fast=False)
    stub_worker.join()
    assert calls["count"] == 1


def test_rate_limited_message_is_requeued_with_the_servers_delay(
    stub_broker, stub_worker, calls, monkeypatch
):
    policy = RetryPolicy(base_ms=1, max_attempts=3)
    actor = _declare(stub_broker, "rp_rate_limited", policy, calls, RateLimited(retry_after_s=2))
    enqueued: list[int | None] = []
    original = stub_broker.enqueue

    def spy(message, *, delay=None):
        enqueued.append(delay)
        return original(message, delay=delay)

    monkeypatch.setattr(stub_broker, "enqueue", spy)
    actor.send()
    # The retry sits on the delay queue for 2 s; one attempt is enough to see its delay.
    deadline = time.monotonic() + 10
    while len(enqueued) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert enqueued[:2] == [None, 2_000], calls
    assert calls["count"] == 1
