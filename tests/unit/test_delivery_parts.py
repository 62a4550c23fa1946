"""Delivery parts without network: chunks, stream entries, lease runner, batch lease, group
commit, channel registry, middleware chain, error mapping of the webhook and email channels."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from mailroom.adapters import channels
from mailroom.adapters.channels import ChannelOutbound
from mailroom.adapters.channels.email import _by_code, build_mail
from mailroom.adapters.channels.webhook import Reply, _check, parse_retry_after
from mailroom.delivery.chunks import ChunkPlan, split_body
from mailroom.delivery.coalesce import Coalescer
from mailroom.delivery.contracts import StreamEntry, decode_entry, decode_payload, encode_entry
from mailroom.delivery.locks import BatchLease, LockOwner, run_under_lease
from mailroom.delivery.ports import Envelope
from mailroom.errors import ChannelRejected, ChannelUnavailable, LeaseLost, RateLimited
from mailroom.settings import DeliverySettings


def test_split_body_keeps_words_whole_and_loses_nothing():
    body = "alpha beta gamma\ndelta epsilon zeta eta theta"
    chunks = split_body(body, 12)
    assert "".join(chunks) == body
    assert all(len(c) <= 12 for c in chunks)
    assert chunks[0] == "alpha beta "


def test_split_body_cuts_hard_when_there_is_no_break_and_keeps_empty_bodies():
    assert split_body("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]
    assert split_body("", 10) == [""]
    with pytest.raises(ValueError):
        split_body("x", 0)


def test_chunk_plan_resumes_at_the_first_unsent_chunk_with_the_recorded_size():
    record = {"size": 5, "total": 4, "status": {"1": "sent", "2": "sent", "3": "failed"}}
    plan = ChunkPlan.load("a" * 20, record, default_size=100)
    assert plan.total == 4 and plan.unsent() == [3, 4] and plan.sent_count == 2
    plan.mark(3, "sent")
    assert plan.record()["status"]["3"] == "sent"
    assert ChunkPlan.load("abc", "garbage", default_size=2).unsent() == [1, 2]  # type: ignore[arg-type]


def test_stream_entries_round_trip_and_malformed_ones_are_none():
    assert decode_entry({k.encode(): v.encode() for k, v in encode_entry(42).items()}) == 42
    for fields in (
        {},
        {b"payload": b"{"},
        {b"payload": b"[]"},
        {b"payload": b'{"message_id": "x"}'},
        {b"payload": b'{"message_id": 0}'},
        {b"other": b"1"},
    ):
        assert decode_entry(fields) is None


def test_lock_owner_guards_one_attempt_per_message_in_a_process():
    owner = LockOwner("host-1", started_at=5.0)
    assert owner.enter(1) and not owner.enter(1) and owner.enter(2)
    owner.leave(1)
    assert owner.enter(1)
    assert LockOwner("host-1", started_at=5.0).token == owner.token
    assert LockOwner("host-1", started_at=6.0).token != owner.token


async def test_run_under_lease_renews_while_work_runs():
    renewals = []

    async def renew():
        renewals.append(1)
        return True

    async def work():
        await asyncio.sleep(0.1)
        return "done"

    assert await run_under_lease(work(), renew=renew, interval_s=0.02) == "done"
    assert len(renewals) >= 3


@pytest.mark.parametrize("failure", ["refused", "error"])
async def test_run_under_lease_cancels_work_when_renewal_fails(failure):
    cancelled = []

    async def renew():
        if failure == "error":
            raise ConnectionError("redis gone")
        return False

    async def work():
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    with pytest.raises(LeaseLost):
        await run_under_lease(work(), renew=renew, interval_s=0.01)
    assert cancelled == [True]


async def test_run_under_lease_lets_outside_cancellation_through():
    async def renew():
        return True

    task = asyncio.create_task(run_under_lease(asyncio.sleep(5), renew=renew, interval_s=0.01))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_retry_after_accepts_seconds_and_http_dates():
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("120") == 120
    assert parse_retry_after("Thu, 01 Jan 2026 12:00:30 GMT", now=now) == 30
    assert parse_retry_after("Thu, 01 Jan 2026 11:00:00 GMT", now=now) == 0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None
    assert parse_retry_after("999999") == 3600


@pytest.mark.parametrize(
    ("status", "headers", "error"),
    [
        (429, {"Retry-After": "5"}, RateLimited),
        (429, {}, ChannelUnavailable),
        (500, {}, ChannelUnavailable),
        (503, {}, ChannelUnavailable),
        (400, {}, ChannelRejected),
        (410, {}, ChannelRejected),
        (301, {}, ChannelRejected),
    ],
)
def test_webhook_status_codes_map_to_error_kinds(status, headers, error):
    with pytest.raises(error):
        _check(Reply(status, "", headers, b""))


def test_webhook_2xx_is_success():
    for status in (200, 201, 202, 204):
        _check(Reply(status, "", {}, b""))


def test_smtp_codes_map_to_retryable_and_permanent():
    assert isinstance(_by_code(421, "busy"), ChannelUnavailable)
    assert isinstance(_by_code(452, "full"), ChannelUnavailable)
    assert isinstance(_by_code(550, "no"), ChannelRejected)
    assert isinstance(_by_code(554, "no"), ChannelRejected)


def test_email_chunks_number_their_subject():
    envelope = Envelope(7, "email", "default", "a@example.com", None, "body", 2, 3)
    mail = build_mail(envelope, "mailroom@example.org")
    assert mail["Subject"] == "Notification 7 (2/3)"
    assert mail["Message-ID"] == "<mailroom.7.2@example.org>"


class FakeChannel:
    instances: list[FakeChannel] = []

    def __init__(self, account: str, settings: DeliverySettings) -> None:
        self.account = account
        self.sent: list[Envelope] = []
        self.closed = False
        FakeChannel.instances.append(self)

    async def send(self, envelope: Envelope) -> None:
        self.sent.append(envelope)

    async def aclose(self) -> None:
        self.closed = True


@pytest.fixture
def fake_plugin():
    channels.register("unit-fake", channels.Capabilities(idempotent=True))(FakeChannel)
    FakeChannel.instances.clear()
    yield
    channels._PLUGINS.pop("unit-fake", None)


def test_builtin_channels_register_themselves():
    found = channels.discover()
    assert {"log", "webhook", "email"} <= set(found)
    assert found["webhook"].idempotent and not found["email"].idempotent


async def test_a_registered_plugin_is_used_behind_its_middleware_chain(fake_plugin):
    calls: list[str] = []

    class Tag:
        def __init__(self, name: str) -> None:
            self.name = name

        def wrap(self, send):
            async def tagged(envelope):
                calls.append(self.name)
                await send(envelope)

            return tagged

    outbound = ChannelOutbound(DeliverySettings())
    outbound.middleware_factories = [
        lambda channel, account, settings, redis: Tag("outer"),
        lambda channel, account, settings, redis: None,  # does not apply
        lambda channel, account, settings, redis: Tag("inner"),
    ]
    envelope = Envelope(1, "unit-fake", "a", "r", None, "b", 1, 1)
    await outbound.sender("unit-fake", "a")(envelope)
    assert calls == ["outer", "inner"]
    assert FakeChannel.instances[0].sent == [envelope]
    assert outbound.is_idempotent("unit-fake")


async def test_invalidate_closes_the_channel_and_rebuilds_on_next_use(fake_plugin):
    outbound = ChannelOutbound(DeliverySettings())
    first = outbound.sender("unit-fake", "a")
    await outbound.invalidate("unit-fake", "a")
    assert FakeChannel.instances[0].closed
    assert outbound.sender("unit-fake", "a") is not first
    await outbound.aclose()
    assert FakeChannel.instances[1].closed


def test_rate_limits_need_a_redis_client():
    from mailroom.settings import RateLimit

    settings = DeliverySettings(rate_limits={"log:default": RateLimit(per_second=1)})
    with pytest.raises(ValueError):
        ChannelOutbound(settings).sender("log", "default")


async def test_coalescer_flushes_callers_ready_together_in_one_round_trip():
    batches: list[list[int]] = []

    async def flush(items):
        batches.append(list(items))
        await asyncio.sleep(0.01)
        return {item: item * 10 for item in items}

    coalescer = Coalescer(flush)
    assert await asyncio.gather(*(coalescer.submit(n) for n in range(5))) == [0, 10, 20, 30, 40]
    assert batches == [[0, 1, 2, 3, 4]]
    # A lone caller goes at once; callers arriving during a flush share the next one.
    first = asyncio.ensure_future(coalescer.submit(7))
    await asyncio.sleep(0.001)
    later = [asyncio.ensure_future(coalescer.submit(n)) for n in (8, 9)]
    assert [await first, *[await f for f in later]] == [70, 80, 90]
    assert batches[1:] == [[7], [8, 9]]
    await coalescer.aclose()


async def test_coalescer_error_reaches_only_the_callers_of_that_flush():
    async def flush(items):
        if 1 in items:
            raise ConnectionError("postgres gone")
        return {item: "ok" for item in items if item != 3}

    coalescer = Coalescer(flush)
    with pytest.raises(ConnectionError):
        await coalescer.submit(1)
    assert await coalescer.submit(2) == "ok"
    with pytest.raises(KeyError):  # the flush gave no result for it
        await coalescer.submit(3)
    await coalescer.aclose()


async def test_batch_lease_loses_one_message_without_touching_its_neighbours():
    renewed: list[list[int]] = []

    async def renew(ids):
        renewed.append(ids)
        return {mid for mid in ids if mid != 2}

    async def work(seconds):
        await asyncio.sleep(seconds)
        return "sent"

    async with BatchLease(renew, interval_s=0.02) as lease:
        lease.hold([1, 2, 3])
        lease.release(3)  # settled already: no longer renewed, never lost
        results = await asyncio.gather(
            lease.guard(1, work(0.1)), lease.guard(2, work(5)), return_exceptions=True
        )
        assert results[0] == "sent"
        assert isinstance(results[1], LeaseLost)
        assert lease.lost(2) and lease.lost(1) is None and lease.lost(3) is None
        with pytest.raises(LeaseLost):  # a lost message does not start sending again
            await lease.guard(2, work(0))
    assert renewed and all(3 not in ids for ids in renewed)


async def test_a_lost_lock_stops_only_its_send_and_the_lane_goes_on():
    # The send runs in the lane's own task: after LeaseLost the lane's next awaits are not
    # cancelled, and a send that swallows the cancellation leaves nothing pending either.
    async def renew(ids):
        return set()

    async def swallowing():
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return "swallowed"

    async def lane(lease, message_id, work):
        try:
            outcome = await lease.guard(message_id, work)
        except LeaseLost:
            outcome = "lost"
        await asyncio.sleep(0.01)  # would raise CancelledError with a request left over
        return outcome, asyncio.current_task().cancelling()

    async with BatchLease(renew, interval_s=0.02) as lease:
        lease.hold([1, 2])
        results = await asyncio.gather(
            lane(lease, 1, asyncio.sleep(5)), lane(lease, 2, swallowing())
        )
    assert results == [("lost", 0), ("swallowed", 0)]


async def test_an_outside_cancellation_during_a_lost_lock_still_propagates():
    async def renew(ids):
        return set()

    async def work(started):
        started.set()
        try:
            await asyncio.sleep(5)
        finally:
            await asyncio.sleep(0.1)  # cleaning up when the renewal finds the lock gone

    async with BatchLease(renew, interval_s=0.02) as lease:
        lease.hold([1])
        started = asyncio.Event()
        task = asyncio.create_task(lease.guard(1, work(started)))
        await started.wait()
        task.cancel()  # shutdown
        with pytest.raises(asyncio.CancelledError):
            await task
        assert lease.lost(1)  # both asked; the shutdown's cancellation wins


async def test_batch_lease_sends_on_through_failed_renewals_while_the_lock_may_be_ours():
    # Redis unreachable for two renewals: the lock (TTL 3 intervals) was ours all along.
    calls: list[list[int]] = []

    async def renew(ids):
        calls.append(ids)
        if len(calls) <= 2:
            raise ConnectionError("redis restarting")
        return set(ids)

    async def work():
        await asyncio.sleep(0.25)
        return "sent"

    async with BatchLease(renew, interval_s=0.05) as lease:
        lease.hold([1])
        assert await lease.guard(1, work()) == "sent"
        assert lease.lost(1) is None
    assert len(calls) >= 3


async def test_batch_lease_gives_a_lock_up_once_failed_renewals_outlast_its_ttl():
    async def renew(ids):
        raise ConnectionError("redis gone")

    async with BatchLease(renew, interval_s=0.02, ttl_s=0.1) as lease:
        held_at = asyncio.get_running_loop().time()
        lease.hold([1])
        with pytest.raises(LeaseLost, match="renewal failed"):
            await lease.guard(1, asyncio.sleep(5))
        assert asyncio.get_running_loop().time() - held_at >= 0.1
        assert 1 not in lease.held


def test_payload_decoding_matches_the_contract_for_odd_values():
    assert decode_payload(b'{"message_id": 5}') == 5
    assert decode_payload('{"message_id": "5"}') == StreamEntry(message_id=5).message_id
    for raw in (None, b"", b"{", b"[]", b'{"message_id": -1}', b'{"message_id": 1.5}', b"\xff"):
        assert decode_payload(raw) is None
