"""deliver_channel_message against real Postgres and Redis (ARCHITECTURE.md, Deliver, steps 1-5)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update

from mailroom.adapters.redis import DeliveryRedis
from mailroom.db.models import AuditEvent, ChannelMessage
from mailroom.delivery.deliver import Deliverer
from mailroom.delivery.locks import LockOwner
from mailroom.delivery.outcomes import Outcome
from mailroom.delivery.statements import UNCERTAIN_ERROR
from mailroom.errors import DeliveryDeferred, PermanentError, RateLimited, RetryableError
from tests.fixtures.delivery import ScriptedOutbound, load_message, make_message

pytestmark = pytest.mark.integration


@pytest.fixture
def keys(delivery_redis, delivery_settings):
    return DeliveryRedis(delivery_redis, stream_key=delivery_settings.stream_key)


@pytest.fixture
def outbound():
    return ScriptedOutbound()


@pytest.fixture
def make_deliverer(delivery_sessions, keys, delivery_settings, outbound):
    def build(owner: str = "worker-a", **overrides):
        values = {
            "sessions": delivery_sessions,
            "redis": keys,
            "outbound": outbound,
            "settings": delivery_settings,
            "owner": LockOwner(owner, started_at=1.0),
        }
        values.update(overrides)
        return Deliverer(**values)

    return build


async def test_message_is_delivered_and_settled(make_deliverer, delivery_sessions, keys, outbound):
    message_id = await make_message(delivery_sessions, subject="Hi")
    assert await make_deliverer().deliver(message_id) == Outcome.DELIVERED
    row = await load_message(delivery_sessions, message_id)
    assert (row.status, row.attempts, row.last_error) == ("delivered", 1, None)
    assert row.delivered_at is not None and row.sending_since is not None
    assert row.chunks == {"size": 4000, "total": 1, "status": {"1": "sent"}}
    assert [e.idempotency_key for e in outbound.sent] == [f"{message_id}:1"]
    assert await keys.client.get(keys.keys.delivered(message_id)) == b"delivered"
    assert 0 < await keys.client.ttl(keys.keys.delivered(message_id)) <= 7 * 24 * 3600
    assert not await keys.client.exists(keys.keys.lock(message_id))


async def test_delivered_key_short_circuits_a_second_delivery(
    make_deliverer, delivery_sessions, outbound
):
    message_id = await make_message(delivery_sessions)
    deliverer = make_deliverer()
    await deliverer.deliver(message_id)
    assert await deliverer.deliver(message_id) == Outcome.SETTLED
    assert len(outbound.sent) == 1
    assert (await load_message(delivery_sessions, message_id)).attempts == 1


async def test_final_status_in_postgres_short_circuits_without_counting_an_attempt(
    make_deliverer, delivery_sessions, outbound
):
    message_id = await make_message(delivery_sessions, status="failed", attempts=3)
    assert await make_deliverer().deliver(message_id) == Outcome.SETTLED
    assert outbound.attempted == []
    assert (await load_message(delivery_sessions, message_id)).attempts == 3


async def test_missing_message_is_done(make_deliverer, keys):
    assert await make_deliverer().deliver(424242) == Outcome.MISSING
    assert not await keys.client.exists(keys.keys.lock(424242))


async def test_lock_held_by_another_owner_means_leave(make_deliverer, delivery_sessions, keys):
    message_id = await make_message(delivery_sessions)
    other = LockOwner("worker-b", started_at=2.0)
    await keys.acquire_lock(message_id, token=other.token, ttl_ms=10_000)
    assert await make_deliverer().deliver(message_id) == Outcome.HELD
    row = await load_message(delivery_sessions, message_id)
    assert (row.status, row.attempts) == ("pending", 0)


async def test_lock_left_by_ourselves_is_retaken(make_deliverer, delivery_sessions, keys):
    message_id = await make_message(delivery_sessions)
    deliverer = make_deliverer()
    await keys.acquire_lock(message_id, token=deliverer.owner.token, ttl_ms=10_000)
    assert await deliverer.deliver(message_id) == Outcome.DELIVERED


async def test_lock_owner_is_host_pid_and_started_at():
    owner = LockOwner()
    value = json.loads(owner.token)
    assert value["owner"] == owner.name and "-" in owner.name
    assert value["started_at"] == round(owner.started_at, 6)


async def test_two_workers_racing_on_one_message_send_once(
    make_deliverer, delivery_sessions, outbound
):
    outbound.delay_s = 0.3
    message_id = await make_message(delivery_sessions)
    outcomes = await asyncio.gather(
        make_deliverer("worker-a").deliver(message_id),
        make_deliverer("worker-b").deliver(message_id),
    )
    assert sorted(outcomes) == sorted([Outcome.DELIVERED, Outcome.HELD])
    assert len(outbound.sent) == 1


async def test_two_attempts_in_one_process_send_once(make_deliverer, delivery_sessions, outbound):
    outbound.delay_s = 0.2
    message_id = await make_message(delivery_sessions)
    deliverer = make_deliverer()
    outcomes = await asyncio.gather(deliverer.deliver(message_id), deliverer.deliver(message_id))
    assert sorted(outcomes) == sorted([Outcome.DELIVERED, Outcome.HELD])
    assert len(outbound.sent) == 1


async def test_renewal_keeps_the_lock_through_a_send_longer_than_its_ttl(
    make_deliverer, delivery_sessions, delivery_settings, keys, outbound
):
    # Room for a renewal up to 2/3 of the TTL late on a loaded worker (a tighter TTL let a
    # lock expire under a parallel system test).
    settings = delivery_settings.model_copy(update={"lock_ttl_ms": 1_000})
    outbound.delay_s = 3.0
    message_id = await make_message(delivery_sessions)
    sending = asyncio.create_task(make_deliverer(settings=settings).deliver(message_id))
    await asyncio.sleep(2.1)  # over twice the TTL: only renewals keep it
    assert await keys.client.exists(keys.keys.lock(message_id))
    assert await make_deliverer("worker-b", settings=settings).deliver(message_id) == Outcome.HELD
    assert await sending == Outcome.DELIVERED
    assert len(outbound.sent) == 1


async def test_lost_renewal_abandons_the_send(
    make_deliverer, delivery_sessions, delivery_settings, keys, outbound
):
    settings = delivery_settings.model_copy(update={"lock_ttl_ms": 300})
    outbound.delay_s = 2.0
    message_id = await make_message(delivery_sessions)
    sending = asyncio.create_task(make_deliverer(settings=settings).deliver(message_id))
    await asyncio.sleep(0.15)
    # Someone else takes the lock over (as after an expiry): our next renewal fails.
    await keys.client.set(keys.keys.lock(message_id), "someone-else", px=10_000)
    outcome = await asyncio.wait_for(sending, 1.5)
    assert outcome == Outcome.LEASE_LOST
    assert outbound.sent == []  # the send was cancelled mid-way
    row = await load_message(delivery_sessions, message_id)
    assert (row.status, row.attempts) == ("sending", 1)
    assert await keys.client.get(keys.keys.lock(message_id)) == b"someone-else"


async def test_retryable_error_schedules_a_retry_with_backoff_and_releases_the_lock(
    make_deliverer, delivery_sessions, delivery_settings, keys, outbound
):
    outbound.errors.append(RetryableError("provider down"))
    message_id = await make_message(delivery_sessions)
    before = datetime.now(UTC)
    with pytest.raises(DeliveryDeferred) as caught:
        await make_deliverer().deliver(message_id)
    row = await load_message(delivery_sessions, message_id)
    assert (row.status, row.attempts) == ("pending", 1)
    assert "provider down" in row.last_error
    base = min(delivery_settings.backoff_base_s * 2, delivery_settings.backoff_cap_s)
    delay_s = (row.next_retry_at - before).total_seconds()
    assert base - 0.05 <= delay_s <= base * 1.5 + 1
    assert base * 1000 <= caught.value.retry_after_ms <= base * 1500
    assert not await keys.client.exists(keys.keys.lock(message_id))
    assert not await keys.client.exists(keys.keys.delivered(message_id))


async def test_retry_then_success(make_deliverer, delivery_sessions, outbound):
    outbound.errors.append(RetryableError("503"))
    message_id = await make_message(delivery_sessions)
    deliverer = make_deliverer()
    with pytest.raises(DeliveryDeferred) as caught:
        await deliverer.deliver(message_id)
    await asyncio.sleep(caught.value.retry_after_ms / 1000)
    assert await deliverer.deliver(message_id) == Outcome.DELIVERED
    row = await load_message(delivery_sessions, message_id)
    assert (row.status, row.attempts, row.last_error) == ("delivered", 2, None)


async def test_a_retry_arriving_early_leaves_the_message_to_its_own_retry(
    make_deliverer, delivery_sessions, outbound
):
    later = datetime.now(UTC) + timedelta(minutes=5)
    message_id = await make_message(delivery_sessions, next_retry_at=later, attempts=1)
    assert await make_deliverer().deliver(message_id) == Outcome.NOT_DUE
    assert (await load_message(delivery_sessions, message_id)).attempts == 1
    assert outbound.attempted == []


async def test_permanent_error_fails_and_is_never_retried(
    make_deliverer, delivery_sessions, keys, outbound
):
    outbound.errors.append(PermanentError("400 bad recipient"))
    message_id = await make_message(delivery_sessions)
    deliverer = make_deliverer()
    assert await deliverer.deliver(message_id) == Outcome.FAILED
    row = await load_message(delivery_sessions, message_id)
    assert (row.status, row.next_retry_at) == ("failed", None)
    assert "400 bad recipient" in row.last_error
    assert await keys.client.get(keys.keys.delivered(message_id)) == b"failed"
    assert await deliverer.deliver(message_id) == Outcome.SETTLED
    assert len(outbound.attempted) == 1


async def test_rate_limited_send_retries_after_the_servers_delay(
    make_deliverer, delivery_sessions, outbound
):
    outbound.errors.append(RateLimited("429", retry_after_s=7))
    message_id = await make_message(delivery_sessions)
    with pytest.raises(DeliveryDeferred) as caught:
        await make_deliverer().deliver(message_id)
    assert caught.value.retry_after_ms == 7_000
    row = await load_message(delivery_sessions, message_id)
    assert row.status == "pending"
    assert 6 <= (row.next_retry_at - datetime.now(UTC)).total_seconds() <= 7


async def test_chunked_send_failing_at_chunk_3_of_5_resumes_at_chunk_3(
    make_deliverer, delivery_sessions, delivery_settings, outbound
):
    settings = delivery_settings.model_copy(update={"chunk_size": 10})
    body = "".join(f"part{n}....\n"[:10] for n in range(1, 6))  # five chunks of 10 chars
    message_id = await make_message(delivery_sessions, body=body)
    outbound.errors.extend([None, None, RetryableError("timeout on chunk 3")])
    deliverer = make_deliverer(settings=settings)
    with pytest.raises(DeliveryDeferred) as caught:
        await deliverer.deliver(message_id)
    row = await load_message(delivery_sessions, message_id)
    assert row.chunks == {
        "size": 10,
        "total": 5,
        "status": {"1": "sent", "2": "sent", "3": "failed"},
    }
    await asyncio.sleep(caught.value.retry_after_ms / 1000)
    # A changed chunk size must not re-split a message that is half sent.
    resumed = make_deliverer(settings=delivery_settings)
    assert await resumed.deliver(message_id) == Outcome.DELIVERED
    assert [e.chunk for e in outbound.attempted] == [1, 2, 3, 3, 4, 5]
    assert "".join(e.body for e in outbound.sent) == body
    assert {e.idempotency_key for e in outbound.sent} == {f"{message_id}:{n}" for n in range(1, 6)}
    row = await load_message(delivery_sessions, message_id)
    assert row.chunks["status"] == {str(n): "sent" for n in range(1, 6)}


async def test_permanent_error_after_some_chunks_is_partial_failed(
    make_deliverer, delivery_sessions, delivery_settings, keys, outbound
):
    settings = delivery_settings.model_copy(update={"chunk_size": 10})
    message_id = await make_message(delivery_sessions, body="x" * 50)
    outbound.errors.extend([None, None, PermanentError("rejected")])
    assert await make_deliverer(settings=settings).deliver(message_id) == Outcome.PARTIAL_FAILED
    row = await load_message(delivery_sessions, message_id)
    assert row.status == "partial_failed"
    assert row.chunks["status"] == {"1": "sent", "2": "sent", "3": "failed"}
    assert await keys.client.get(keys.keys.delivered(message_id)) == b"partial_failed"


async def test_retryable_failures_end_at_the_maximum_of_attempts(
    make_deliverer, delivery_sessions, delivery_settings, outbound
):
    settings = delivery_settings.model_copy(update={"max_attempts": 2})
    outbound.errors.extend([RetryableError("503"), RetryableError("503 again")])
    message_id = await make_message(delivery_sessions)
    deliverer = make_deliverer(settings=settings)
    with pytest.raises(DeliveryDeferred) as caught:
        await deliverer.deliver(message_id)
    await asyncio.sleep(caught.value.retry_after_ms / 1000)
    assert await deliverer.deliver(message_id) == Outcome.FAILED
    row = await load_message(delivery_sessions, message_id)
    assert (row.status, row.attempts) == ("failed", 2)
    assert row.last_error.startswith("gave up after 2 attempts")


async def test_a_crash_loop_still_ends_because_attempts_are_counted_first(
    make_deliverer, delivery_sessions, delivery_settings, outbound
):
    # Earlier attempts died before recording anything but their attempt count.
    message_id = await make_message(
        delivery_sessions, attempts=delivery_settings.max_attempts, last_error="worker killed"
    )
    assert await make_deliverer().deliver(message_id) == Outcome.FAILED
    assert outbound.attempted == []
    row = await load_message(delivery_sessions, message_id)
    assert row.attempts == delivery_settings.max_attempts + 1
    assert "last error: worker killed" in row.last_error


async def test_attempt_is_committed_before_the_send(make_deliverer, delivery_sessions, outbound):
    seen = []

    class Peeking(ScriptedOutbound):
        def sender(self, channel, account):
            async def send(envelope):
                row = await load_message(delivery_sessions, envelope.message_id)
                seen.append((row.status, row.attempts))

            return send

    message_id = await make_message(delivery_sessions)
    await make_deliverer(outbound=Peeking()).deliver(message_id)
    assert seen == [("sending", 1)]


async def test_a_send_left_midway_ends_uncertain_for_a_non_idempotent_channel(
    make_deliverer, delivery_sessions, keys, outbound
):
    message_id = await make_message(
        delivery_sessions, status="sending", attempts=1, sending_since=datetime.now(UTC)
    )
    assert await make_deliverer().deliver(message_id) == Outcome.UNCERTAIN
    assert outbound.attempted == []
    row = await load_message(delivery_sessions, message_id)
    assert (row.status, row.last_error) == ("uncertain", UNCERTAIN_ERROR)
    async with delivery_sessions() as session:
        events = (await session.execute(select(AuditEvent))).scalars().all()
    assert [(e.action, e.detail["count"]) for e in events] == [("delivery.stale_recovered", 1)]


async def test_a_send_left_midway_is_resent_on_an_idempotent_channel(
    make_deliverer, delivery_sessions
):
    idempotent = ScriptedOutbound(idempotent=True)
    message_id = await make_message(
        delivery_sessions, status="sending", attempts=1, sending_since=datetime.now(UTC)
    )
    assert await make_deliverer(outbound=idempotent).deliver(message_id) == Outcome.DELIVERED
    assert len(idempotent.sent) == 1


async def test_a_takeover_by_a_later_attempt_fences_our_writes(
    make_deliverer, delivery_sessions, outbound
):
    class TakenOver(ScriptedOutbound):
        def sender(self, channel, account):
            async def send(envelope):
                async with delivery_sessions() as session, session.begin():
                    await session.execute(
                        update(ChannelMessage)
                        .where(ChannelMessage.id == envelope.message_id)
                        .values(attempts=ChannelMessage.attempts + 1)
                    )

            return send

    message_id = await make_message(delivery_sessions)
    assert await make_deliverer(outbound=TakenOver()).deliver(message_id) == Outcome.LEASE_LOST
    row = await load_message(delivery_sessions, message_id)
    assert (row.status, row.attempts) == ("sending", 2)


async def test_metrics_count_deliveries_failures_and_send_time(
    make_deliverer, delivery_sessions, outbound
):
    from prometheus_client import REGISTRY

    def sample(name, **labels):
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = (
        sample("mailroom_delivery_delivered_total", channel="log", account="default"),
        sample(
            "mailroom_delivery_failed_total", channel="log", account="default", reason="permanent"
        ),
        sample("mailroom_delivery_send_seconds_count", channel="log", account="default"),
    )
    delivered = await make_message(delivery_sessions)
    rejected = await make_message(delivery_sessions)
    deliverer = make_deliverer()
    await deliverer.deliver(delivered)
    outbound.errors.append(PermanentError("no"))
    await deliverer.deliver(rejected)
    after = (
        sample("mailroom_delivery_delivered_total", channel="log", account="default"),
        sample(
            "mailroom_delivery_failed_total", channel="log", account="default", reason="permanent"
        ),
        sample("mailroom_delivery_send_seconds_count", channel="log", account="default"),
    )
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 2]
