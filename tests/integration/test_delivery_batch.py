"""Batches of deliveries against real Postgres and Redis: shared round trips, own outcomes."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mailroom.adapters.redis import DeliveryRedis
from mailroom.delivery.deliver import Deliverer
from mailroom.delivery.locks import LockOwner
from mailroom.delivery.outcomes import Outcome
from mailroom.delivery.ports import Envelope
from mailroom.errors import DeliveryDeferred, PermanentError, RetryableError, ServiceUnavailable
from tests.fixtures.delivery import load_message, make_message

pytestmark = pytest.mark.integration


class KeyedOutbound:
    """A fake ``Outbound`` that fails or dawdles per message id (batches send concurrently)."""

    def __init__(self) -> None:
        self.errors: dict[int, BaseException] = {}
        self.delays: dict[int, float] = {}
        self.sent: list[Envelope] = []
        self.started: list[int] = []
        self.on_send: Any = None

    def sender(self, channel: str, account: str) -> Any:
        async def send(envelope: Envelope) -> None:
            self.started.append(envelope.message_id)
            if self.on_send is not None:
                await self.on_send(envelope)
            await asyncio.sleep(self.delays.get(envelope.message_id, 0))
            error = self.errors.get(envelope.message_id)
            if error is not None:
                raise error
            self.sent.append(envelope)

        return send

    def is_idempotent(self, channel: str) -> bool:
        return False


@pytest.fixture
def keys(delivery_redis, delivery_settings):
    return DeliveryRedis(delivery_redis, stream_key=delivery_settings.stream_key)


@pytest.fixture
def outbound():
    return KeyedOutbound()


@pytest.fixture
def deliverer(delivery_sessions, keys, delivery_settings, outbound):
    return Deliverer(
        sessions=delivery_sessions,
        redis=keys,
        outbound=outbound,
        settings=delivery_settings,
        owner=LockOwner("worker-a", started_at=1.0),
    )


async def test_a_batch_delivers_every_message_and_settles_each(
    deliverer, delivery_sessions, keys, outbound, mailroom_logs
):
    ids = [await make_message(delivery_sessions, body=f"hello {n}") for n in range(30)]
    result = await deliverer.deliver_many([*ids, ids[0]])  # a duplicate is delivered once
    assert result.outcomes == dict.fromkeys(ids, Outcome.DELIVERED) and result.retries == {}
    # One INFO line for the batch; each delivery is a DEBUG line with its message's id
    assert mailroom_logs.messages(logging.INFO) == ["Delivery batch: 30 delivered"]
    assert sum("Delivered message" in m for m in mailroom_logs.messages(logging.DEBUG)) == 30
    assert sorted(e.message_id for e in outbound.sent) == ids
    for message_id in ids:
        row = await load_message(delivery_sessions, message_id)
        assert (row.status, row.attempts, row.chunks["status"]) == ("delivered", 1, {"1": "sent"})
        assert row.delivered_at is not None
        assert await keys.client.get(keys.keys.delivered(message_id)) == b"delivered"
        assert not await keys.client.exists(keys.keys.lock(message_id))
    again = await deliverer.deliver_many(ids)
    assert set(again.outcomes.values()) == {Outcome.SETTLED}
    assert len(outbound.sent) == len(ids)


async def test_each_message_of_a_batch_gets_its_own_outcome(
    deliverer, delivery_sessions, keys, outbound
):
    ok = await make_message(delivery_sessions)
    retry = await make_message(delivery_sessions)
    rejected = await make_message(delivery_sessions)
    held = await make_message(delivery_sessions)
    later = datetime.now(UTC) + timedelta(minutes=5)
    not_due = await make_message(delivery_sessions, next_retry_at=later, attempts=1)
    settled = await make_message(delivery_sessions, status="failed", attempts=2)
    missing = 424242
    outbound.errors = {retry: RetryableError("503"), rejected: PermanentError("400")}
    await keys.acquire_lock(held, token="someone-else", ttl_ms=10_000)

    result = await deliverer.deliver_many([ok, retry, rejected, held, not_due, settled, missing])

    assert result.outcomes == {
        ok: Outcome.DELIVERED,
        retry: Outcome.DEFERRED,
        rejected: Outcome.FAILED,
        held: Outcome.HELD,
        not_due: Outcome.NOT_DUE,
        settled: Outcome.SETTLED,
        missing: Outcome.MISSING,
    }
    assert set(result.retries) == {retry}
    assert isinstance(result.retries[retry], DeliveryDeferred)
    assert result.retries[retry].retry_after_ms > 0
    states = {mid: (await load_message(delivery_sessions, mid)) for mid in (ok, retry, rejected)}
    assert (states[ok].status, states[ok].attempts) == ("delivered", 1)
    assert (states[retry].status, states[retry].attempts) == ("pending", 1)
    assert states[retry].next_retry_at is not None
    assert (states[rejected].status, states[rejected].attempts) == ("failed", 1)
    assert (await load_message(delivery_sessions, not_due)).attempts == 1
    assert (await load_message(delivery_sessions, held)).attempts == 0
    assert await keys.client.get(keys.keys.lock(held)) == b"someone-else"
    for message_id in (ok, retry, rejected, not_due, settled, missing):
        assert not await keys.client.exists(keys.keys.lock(message_id))


async def test_a_lost_lock_stops_only_that_messages_send(
    deliverer, delivery_sessions, keys, outbound
):
    # A TTL with room for a renewal up to 2/3 of it late: at 300 ms, a worker loaded by a
    # parallel system test let the slow message's lock expire too (CI, once).
    settings = deliverer.settings.model_copy(update={"lock_ttl_ms": 1_500})
    deliverer = dataclasses.replace(deliverer, settings=settings)
    slow = await make_message(delivery_sessions)
    lost = await make_message(delivery_sessions)
    outbound.delays = {slow: 1.8, lost: 6.0}
    running = asyncio.create_task(deliverer.deliver_many([slow, lost]))
    await asyncio.sleep(0.15)
    # Someone takes one lock over (as after an expiry): only that send is abandoned.
    await keys.client.set(keys.keys.lock(lost), "someone-else", px=20_000)
    result = await asyncio.wait_for(running, 4.5)
    assert result.outcomes == {slow: Outcome.DELIVERED, lost: Outcome.LEASE_LOST}
    assert [e.message_id for e in outbound.sent] == [slow]  # renewed past its TTL
    row = await load_message(delivery_sessions, lost)
    assert (row.status, row.attempts) == ("sending", 1)
    assert await keys.client.get(keys.keys.lock(lost)) == b"someone-else"


async def test_a_message_is_claimed_only_when_its_turn_to_send_comes(
    deliverer, delivery_sessions, keys, outbound
):
    settings = deliverer.settings.model_copy(update={"batch_concurrency": 1})
    deliverer = dataclasses.replace(deliverer, settings=settings)
    first = await make_message(delivery_sessions)
    second = await make_message(delivery_sessions)
    seen: list[tuple[int, str, int]] = []

    async def peek(envelope: Envelope) -> None:
        for message_id in (first, second):
            row = await load_message(delivery_sessions, message_id)
            seen.append((message_id, row.status, row.attempts))

    outbound.on_send = peek
    result = await deliverer.deliver_many([first, second])
    assert set(result.outcomes.values()) == {Outcome.DELIVERED}
    # While the first was sent, the second was not claimed yet (a crash leaves it pending).
    assert seen[:2] == [(first, "sending", 1), (second, "pending", 0)]
    assert seen[2:] == [(first, "delivered", 1), (second, "sending", 1)]


async def test_batches_running_side_by_side_share_their_round_trips(
    deliverer, delivery_sessions, outbound
):
    ids = [await make_message(delivery_sessions, body=f"hello {n}") for n in range(20)]
    first, second = await asyncio.gather(
        deliverer.deliver_many(ids[:10]), deliverer.deliver_many(ids[10:])
    )
    assert {**first.outcomes, **second.outcomes} == dict.fromkeys(ids, Outcome.DELIVERED)
    rounds = deliverer._shared
    # As a worker's threads run their batches on one loop: their locks and claims went together
    # (one round: the locks, then at once the claims of those taken), and so did their
    # settlements (a second round).
    assert rounds._turns.flushes == 2
    for message_id in ids:
        assert (await load_message(delivery_sessions, message_id)).status == "delivered"


async def test_batch_lock_operations_take_extend_and_settle_many_at_once(keys):
    await keys.settle(1, token="", delivered="delivered", delivered_ttl_s=60)
    await keys.acquire_lock(2, token="other", ttl_ms=10_000)
    await keys.acquire_lock(3, token="me", ttl_ms=10_000)
    found = await keys.acquire_locks([1, 2, 3, 4], token="me", ttl_ms=5_000)
    assert {mid: r.state for mid, r in found.items()} == {
        1: "delivered",
        2: "held",
        3: "retaken",
        4: "acquired",
    }
    assert found[2].holder == "other"
    assert await keys.extend_locks([2, 3, 4], token="me", ttl_ms=20_000) == {3, 4}
    assert 10_000 < await keys.client.pttl(keys.keys.lock(4)) <= 20_000
    await keys.settle_many([(2, ""), (3, "failed"), (4, "")], token="me", delivered_ttl_s=60)
    assert await keys.client.get(keys.keys.lock(2)) == b"other"  # not ours: kept
    assert not await keys.client.exists(keys.keys.lock(3), keys.keys.lock(4))
    assert await keys.client.get(keys.keys.delivered(3)) == b"failed"
    assert not await keys.client.exists(keys.keys.delivered(4))


async def test_a_message_is_locked_only_when_its_turn_comes(
    deliverer, delivery_sessions, keys, outbound
):
    settings = deliverer.settings.model_copy(update={"batch_concurrency": 1})
    deliverer = dataclasses.replace(deliverer, settings=settings)
    first = await make_message(delivery_sessions)
    waiting = await make_message(delivery_sessions)
    outbound.delays = {first: 0.3}
    running = asyncio.create_task(deliverer.deliver_many([first, waiting]))
    await asyncio.sleep(0.15)
    # A worker killed now would strand only the message it was sending.
    assert await keys.client.exists(keys.keys.lock(first))
    assert not await keys.client.exists(keys.keys.lock(waiting))
    await keys.client.set(keys.keys.lock(waiting), "someone-else", px=10_000)
    result = await asyncio.wait_for(running, 2)
    assert result.outcomes == {first: Outcome.DELIVERED, waiting: Outcome.HELD}
    row = await load_message(delivery_sessions, waiting)
    assert (row.status, row.attempts) == ("pending", 0)
    assert outbound.started == [first]


async def test_sent_messages_settle_in_postgres_when_redis_fails_after_the_send(
    deliverer, delivery_sessions, keys, outbound, monkeypatch
):
    ids = [await make_message(delivery_sessions, body=f"hello {n}") for n in range(5)]

    async def redis_down(*args: Any, **kwargs: Any) -> None:
        raise ServiceUnavailable("redis unavailable: connection reset by peer")

    monkeypatch.setattr(keys, "settle_many", redis_down)
    result = await deliverer.deliver_many(ids)

    assert result.outcomes == dict.fromkeys(ids, Outcome.DELIVERED)
    for message_id in ids:
        assert (await load_message(delivery_sessions, message_id)).status == "delivered"
    # Redis is back, and its keys are gone: a redelivery finds the record in Postgres.
    monkeypatch.undo()
    await keys.client.delete(*(keys.keys.lock(mid) for mid in ids))
    again = await deliverer.deliver_many(ids)
    assert set(again.outcomes.values()) == {Outcome.SETTLED}
    assert sorted(e.message_id for e in outbound.sent) == ids  # each sent once


async def test_a_claim_finds_its_rows_by_primary_key_among_many_open_messages(delivery_sessions):
    from sqlalchemy import text

    from mailroom.db.engine import autocommit
    from mailroom.delivery.statements import CLAIM

    async with autocommit(delivery_sessions) as connection:
        # A burst of new messages the statistics have not seen (no ANALYZE since).
        ids = (
            (
                await connection.execute(
                    text(
                        "INSERT INTO channel_message (channel, account, recipient, body, status) "
                        "SELECT 'log', 'default', 'ops', 'hello', 'pending' "
                        "FROM generate_series(1, 3000) RETURNING id"
                    )
                )
            )
            .scalars()
            .all()
        )
        plan = (
            await connection.exec_driver_sql(
                "EXPLAIN (FORMAT JSON) " + CLAIM, {"ids": ids[100:150], "due_slack_s": 1.0}
            )
        ).scalar_one()
    # From the open-message index, the locking subquery ran once per open message.
    assert "ix_channel_message_open" not in str(plan)
    assert "pk_channel_message" in str(plan)


async def test_a_failed_claim_round_releases_its_locks_and_retries_each_message(
    deliverer, delivery_sessions, keys, outbound, monkeypatch
):
    # The locks went out, then the claims of that round failed (Postgres gone mid-round).
    ids = [await make_message(delivery_sessions, body=f"hello {n}") for n in range(3)]
    rounds = deliverer._rounds()
    write = rounds._write

    async def postgres_down(successes: Any, message_ids: Any) -> Any:
        raise ServiceUnavailable("database unavailable: connection reset by peer")

    monkeypatch.setattr(rounds, "_write", postgres_down)
    result = await deliverer.deliver_many(ids)

    assert result.outcomes == dict.fromkeys(ids, Outcome.DEFERRED)
    assert set(result.retries) == set(ids)
    assert outbound.sent == []
    for message_id in ids:
        row = await load_message(delivery_sessions, message_id)
        assert (row.status, row.attempts) == ("pending", 0)
        assert not await keys.client.exists(keys.keys.lock(message_id))  # let in at once
    monkeypatch.setattr(rounds, "_write", write)
    again = await deliverer.deliver_many(ids)
    assert again.outcomes == dict.fromkeys(ids, Outcome.DELIVERED)


def _one_lane(deliverer: Deliverer) -> Deliverer:
    settings = deliverer.settings.model_copy(update={"batch_concurrency": 1})
    return dataclasses.replace(deliverer, settings=settings)


async def test_a_lane_settles_each_message_in_the_round_that_takes_its_next(
    deliverer, delivery_sessions
):
    deliverer = _one_lane(deliverer)
    ids = [await make_message(delivery_sessions, body=f"hello {n}") for n in range(3)]
    result = await deliverer.deliver_many(ids)
    assert result.outcomes == dict.fromkeys(ids, Outcome.DELIVERED)
    # Take the first; settle each and take the next; settle the last: 4 rounds, not 6.
    assert deliverer._shared._turns.flushes == 4


async def test_a_failed_settle_and_claim_round_retries_both_messages_and_loses_neither(
    deliverer, delivery_sessions, keys, outbound, monkeypatch
):
    deliverer = _one_lane(deliverer)
    first, second = [await make_message(delivery_sessions) for _ in range(2)]
    rounds = deliverer._rounds()
    write = rounds._write

    async def down_when_both(successes: Any, message_ids: Any) -> Any:
        if successes and message_ids:  # the first's settlement with the second's claim
            raise ServiceUnavailable("database unavailable: connection reset by peer")
        return await write(successes, message_ids)

    monkeypatch.setattr(rounds, "_write", down_when_both)
    result = await deliverer.deliver_many([first, second])

    assert result.outcomes == {first: Outcome.DEFERRED, second: Outcome.DEFERRED}
    assert all(isinstance(e, ServiceUnavailable) for e in result.retries.values())
    assert [e.message_id for e in outbound.sent] == [first]
    # The first was sent, not settled: its attempt stands, its retry settles it. The second was
    # neither claimed nor sent, and its lock is let go at once.
    row = await load_message(delivery_sessions, first)
    assert (row.status, row.attempts) == ("sending", 1)
    row = await load_message(delivery_sessions, second)
    assert (row.status, row.attempts) == ("pending", 0)
    assert not await keys.client.exists(keys.keys.lock(second))


async def test_a_lock_round_that_fails_still_settles_the_messages_sent_before_it(
    deliverer, delivery_sessions, keys, outbound, monkeypatch
):
    deliverer = _one_lane(deliverer)
    first, second = [await make_message(delivery_sessions) for _ in range(2)]
    acquire_locks, calls = keys.acquire_locks, []

    async def down_at_the_second(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        if len(calls) == 2:  # the second's lock, in the round settling the first
            raise ServiceUnavailable("redis unavailable: connection reset by peer")
        return await acquire_locks(*args, **kwargs)

    monkeypatch.setattr(keys, "acquire_locks", down_at_the_second)
    result = await deliverer.deliver_many([first, second])

    assert result.outcomes == {first: Outcome.DELIVERED, second: Outcome.DEFERRED}
    assert isinstance(result.retries[second], ServiceUnavailable)
    assert (await load_message(delivery_sessions, first)).status == "delivered"
    row = await load_message(delivery_sessions, second)
    assert (row.status, row.attempts) == ("pending", 0)
