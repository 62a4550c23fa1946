"""Producer, pending re-add sweep, stale recovery and replay against real Postgres and Redis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from mailroom.adapters.redis import DeliveryRedis
from mailroom.db.engine import transaction
from mailroom.db.models import AuditEvent, ChannelMessage
from mailroom.delivery.contracts import decode_entry
from mailroom.delivery.producer import create_message, enqueue_messages, readd_pending_messages
from mailroom.delivery.replay import replay_messages
from mailroom.delivery.stale import recover_stale_deliveries
from mailroom.delivery.statements import UNCERTAIN_ERROR
from mailroom.errors import NotReplayable
from tests.fixtures.delivery import load_message, make_message

pytestmark = pytest.mark.integration


async def stream_ids(client, settings) -> list[int]:
    entries = await client.xrange(settings.stream_key)
    return [decode_entry(fields) for _, fields in entries]


async def audit(sessions) -> list[AuditEvent]:
    async with sessions() as session:
        return list((await session.execute(select(AuditEvent).order_by(AuditEvent.id))).scalars())


async def test_message_is_created_in_the_callers_transaction_and_added_after_commit(
    delivery_sessions, delivery_redis, delivery_settings
):
    async with transaction(delivery_sessions) as session:
        message_id = await create_message(
            session, channel="log", recipient="ops", body="hi", dedupe_key="mail-1:ops"
        )
        assert await stream_ids(delivery_redis, delivery_settings) == []
    await enqueue_messages(
        [message_id], redis=delivery_redis, sessions=delivery_sessions, settings=delivery_settings
    )
    assert await stream_ids(delivery_redis, delivery_settings) == [message_id]
    row = await load_message(delivery_sessions, message_id)
    assert (row.status, row.attempts) == ("pending", 0)
    assert row.enqueued_at is not None


async def test_a_rolled_back_transaction_leaves_no_message(delivery_sessions):
    with pytest.raises(RuntimeError):
        async with transaction(delivery_sessions) as session:
            await create_message(session, channel="log", recipient="ops", body="hi")
            raise RuntimeError("caller failed")
    async with delivery_sessions() as session:
        assert (await session.execute(select(ChannelMessage))).first() is None


async def test_a_used_dedupe_key_inserts_nothing(delivery_sessions):
    async with transaction(delivery_sessions) as session:
        first = await create_message(
            session, channel="log", recipient="a", body="x", dedupe_key="k"
        )
        again = await create_message(
            session, channel="log", recipient="a", body="x", dedupe_key="k"
        )
    assert first is not None and again is None


async def test_stream_is_trimmed_to_about_maxlen(delivery_redis, delivery_settings):
    keys = DeliveryRedis(delivery_redis, stream_key=delivery_settings.stream_key)
    for start in range(0, 2_000, 500):
        await keys.add_to_stream(range(start + 1, start + 501), maxlen=100)
    # Approximate trimming drops whole nodes (100 entries each by default).
    assert await delivery_redis.xlen(delivery_settings.stream_key) <= 300


async def test_readd_sweep_picks_never_added_and_long_idle_pending_messages(
    delivery_sessions, delivery_redis, delivery_settings
):
    now = datetime.now(UTC)
    old = now - timedelta(seconds=delivery_settings.readd_after_s + 60)
    never_added = await make_message(delivery_sessions)
    lost = await make_message(delivery_sessions, enqueued_at=old)
    recent = await make_message(delivery_sessions, enqueued_at=now)
    locked = await make_message(delivery_sessions, enqueued_at=old)
    waiting_retry = await make_message(
        delivery_sessions, enqueued_at=old, next_retry_at=now + timedelta(minutes=1)
    )
    delivered = await make_message(delivery_sessions, status="delivered")
    keys = DeliveryRedis(delivery_redis, stream_key=delivery_settings.stream_key)
    await keys.acquire_lock(locked, token="someone", ttl_ms=10_000)

    readded = await readd_pending_messages(
        sessions=delivery_sessions, redis=delivery_redis, settings=delivery_settings
    )
    assert readded == [never_added, lost]
    assert await stream_ids(delivery_redis, delivery_settings) == [never_added, lost]
    assert (await load_message(delivery_sessions, lost)).enqueued_at > old
    # A second pass right away finds nothing new.
    assert (
        await readd_pending_messages(
            sessions=delivery_sessions, redis=delivery_redis, settings=delivery_settings
        )
        == []
    )
    assert {recent, locked, waiting_retry, delivered}.isdisjoint(readded)


async def stale(sessions, client, settings, *, idempotent=frozenset()):
    return await recover_stale_deliveries(
        sessions=sessions,
        redis=client,
        settings=settings,
        is_idempotent=lambda channel: channel in idempotent,
    )


async def test_stale_log_message_becomes_uncertain_with_one_audit_event(
    delivery_sessions, delivery_redis, delivery_settings
):
    long_ago = datetime.now(UTC) - timedelta(seconds=delivery_settings.stale_after_s + 5)
    first = await make_message(delivery_sessions, status="sending", sending_since=long_ago)
    second = await make_message(delivery_sessions, status="sending", sending_since=long_ago)
    fresh = await make_message(delivery_sessions, status="sending", sending_since=datetime.now(UTC))
    locked = await make_message(delivery_sessions, status="sending", sending_since=long_ago)
    keys = DeliveryRedis(delivery_redis, stream_key=delivery_settings.stream_key)
    await keys.acquire_lock(locked, token="alive", ttl_ms=10_000)

    result = await stale(delivery_sessions, delivery_redis, delivery_settings)
    assert result.uncertain == [first, second] and result.resent == []
    for message_id in (first, second):
        row = await load_message(delivery_sessions, message_id)
        assert (row.status, row.last_error) == ("uncertain", UNCERTAIN_ERROR)
        assert await delivery_redis.get(keys.keys.delivered(message_id)) == b"uncertain"
    for message_id in (fresh, locked):
        assert (await load_message(delivery_sessions, message_id)).status == "sending"
    [event] = await audit(delivery_sessions)
    assert event.action == "delivery.stale_recovered"
    assert event.detail["count"] == 2 and event.detail["message_ids"] == [first, second]
    assert await stream_ids(delivery_redis, delivery_settings) == []


async def test_stale_webhook_message_is_resent(
    delivery_sessions, delivery_redis, delivery_settings
):
    long_ago = datetime.now(UTC) - timedelta(seconds=delivery_settings.stale_after_s + 5)
    message_id = await make_message(
        delivery_sessions, channel="webhook", status="sending", sending_since=long_ago, attempts=1
    )
    result = await stale(
        delivery_sessions, delivery_redis, delivery_settings, idempotent={"webhook"}
    )
    assert result.resent == [message_id] and result.uncertain == []
    row = await load_message(delivery_sessions, message_id)
    assert (row.status, row.attempts) == ("pending", 1)
    assert row.enqueued_at is not None
    assert await stream_ids(delivery_redis, delivery_settings) == [message_id]


async def test_stale_message_whose_send_was_recorded_in_redis_only_is_delivered(
    delivery_sessions, delivery_redis, delivery_settings
):
    long_ago = datetime.now(UTC) - timedelta(seconds=delivery_settings.stale_after_s + 5)
    message_id = await make_message(delivery_sessions, status="sending", sending_since=long_ago)
    keys = DeliveryRedis(delivery_redis, stream_key=delivery_settings.stream_key)
    await keys.settle(message_id, token="", delivered="delivered", delivered_ttl_s=60)
    result = await stale(delivery_sessions, delivery_redis, delivery_settings)
    assert result.delivered == [message_id]
    assert (await load_message(delivery_sessions, message_id)).status == "delivered"
    assert await audit(delivery_sessions) == []


class CountingRedis:
    """The real client, counting round trips (commands and pipeline executes)."""

    def __init__(self, client, on_call=None):
        self.client, self.calls, self.on_call = client, 0, on_call

    def __getattr__(self, name):
        return getattr(self.client, name)

    async def _count(self):
        self.calls += 1
        if self.on_call is not None:
            await self.on_call()

    async def execute_command(self, *args, **options):
        await self._count()
        return await self.client.execute_command(*args, **options)

    def pipeline(self, *args, **options):
        pipe, count = self.client.pipeline(*args, **options), self._count
        execute = pipe.execute

        async def counted_execute(*a, **kw):
            await count()
            return await execute(*a, **kw)

        pipe.execute = counted_execute
        return pipe


async def test_stale_recovery_reads_redis_once_per_pass_before_it_locks_rows(
    delivery_sessions, delivery_redis, delivery_settings
):
    long_ago = datetime.now(UTC) - timedelta(seconds=delivery_settings.stale_after_s + 5)
    ids = [
        await make_message(delivery_sessions, status="sending", sending_since=long_ago)
        for _ in range(6)
    ]
    keys = DeliveryRedis(delivery_redis, stream_key=delivery_settings.stream_key)
    for message_id in ids[:3]:
        await keys.acquire_lock(message_id, token="alive", ttl_ms=10_000)
    for message_id in ids[3:]:
        await keys.settle(message_id, token="", delivered="delivered", delivered_ttl_s=60)
    unlocked_rows = []

    async def rows_are_unlocked():
        # While Redis is asked, no row of the pass may be locked: NOWAIT would fail.
        async with delivery_sessions() as other, other.begin():
            found = await other.execute(
                select(ChannelMessage.id)
                .where(ChannelMessage.id.in_(ids))
                .with_for_update(nowait=True)
            )
            unlocked_rows.append(len(found.all()))

    counting = CountingRedis(delivery_redis, on_call=rows_are_unlocked)
    result = await stale(delivery_sessions, counting, delivery_settings)

    assert result.delivered == ids[3:] and result.uncertain == result.resent == []
    assert counting.calls == 1 and unlocked_rows == [6]
    for message_id in ids[:3]:
        assert (await load_message(delivery_sessions, message_id)).status == "sending"


async def test_replay_by_status_resets_to_pending_and_readds(
    delivery_sessions, delivery_redis, delivery_settings
):
    keys = DeliveryRedis(delivery_redis, stream_key=delivery_settings.stream_key)
    failed = await make_message(delivery_sessions, status="failed", attempts=8, last_error="x")
    other = await make_message(delivery_sessions, status="uncertain")
    partial = await make_message(
        delivery_sessions,
        status="partial_failed",
        chunks={"size": 4, "total": 3, "status": {"1": "sent", "2": "failed"}},
    )
    await keys.settle(failed, token="", delivered="failed", delivered_ttl_s=60)
    replayed = await replay_messages(
        sessions=delivery_sessions,
        redis=delivery_redis,
        settings=delivery_settings,
        actor_id="cli:alice",
        status="failed",
    )
    assert replayed == [failed]
    row = await load_message(delivery_sessions, failed)
    assert (row.status, row.attempts, row.next_retry_at) == ("pending", 0, None)
    assert not await delivery_redis.exists(keys.keys.delivered(failed))
    assert await stream_ids(delivery_redis, delivery_settings) == [failed]
    assert (await load_message(delivery_sessions, other)).status == "uncertain"

    assert await replay_messages(
        sessions=delivery_sessions,
        redis=delivery_redis,
        settings=delivery_settings,
        actor_id="cli:alice",
        message_id=partial,
    ) == [partial]
    # Sent chunks stay recorded, so the replay resumes at the first unsent one.
    assert (await load_message(delivery_sessions, partial)).chunks["status"]["1"] == "sent"
    events = await audit(delivery_sessions)
    assert [(e.action, e.actor_id, e.target) for e in events] == [
        ("delivery.replayed", "cli:alice", f"channel_message:{failed}"),
        ("delivery.replayed", "cli:alice", f"channel_message:{partial}"),
    ]


async def test_replay_refuses_messages_that_are_not_stuck(
    delivery_sessions, delivery_redis, delivery_settings
):
    delivered = await make_message(delivery_sessions, status="delivered")
    for kwargs in ({"message_id": delivered}, {"message_id": 999_999}, {"status": "pending"}):
        with pytest.raises(NotReplayable):
            await replay_messages(
                sessions=delivery_sessions,
                redis=delivery_redis,
                settings=delivery_settings,
                actor_id="cli:bob",
                **kwargs,
            )
    assert await audit(delivery_sessions) == []
