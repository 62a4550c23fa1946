"""The stream bridge against a real Redis: consumer group, claims, acks, malformed entries,
a bridge killed before XACK, a Redis restart, and SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from bridges.stream import StreamBridge, create_client
from bridges.stream_consumers import IdleConsumers
from mailroom.adapters.redis import DeliveryRedis
from mailroom.delivery.contracts import decode_entry
from mailroom.delivery.deliver import Deliverer
from mailroom.delivery.locks import LockOwner
from mailroom.delivery.outcomes import Outcome
from mailroom.devtools.stack import EmbeddedRedis
from mailroom.settings import RedisSettings
from tests.fixtures.delivery import ScriptedOutbound, load_message, make_message

pytestmark = pytest.mark.integration


class Recorder:
    """A ``send`` that records the batches and their ids, and can be told to fail."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.batches: list[list[int]] = []
        self.failing = False
        self.lock = threading.Lock()

    def __call__(self, message_ids: list[int]) -> None:
        if self.failing:
            raise ConnectionError("broker down")
        with self.lock:
            self.batches.append(list(message_ids))
            self.ids.extend(message_ids)


async def wait_until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


class Running:
    """A bridge running as a task of this test's loop."""

    def __init__(self, bridge: StreamBridge) -> None:
        self.bridge = bridge
        self.task = asyncio.create_task(bridge.run())

    async def stop(self) -> None:
        self.bridge.stop.set()
        await asyncio.wait_for(self.task, 5)


@pytest.fixture
def bridge_factory(delivery_redis, delivery_settings):
    running: list[Running] = []

    def start(send, *, consumer: str = "bridge-1", client=None, settings=None) -> Running:
        bridge = StreamBridge(
            client or delivery_redis,
            settings=settings or delivery_settings,
            send=send,
            consumer=consumer,
        )
        running.append(Running(bridge))
        return running[-1]

    yield start
    for item in running:
        item.bridge.stop.set()


async def add(client, settings, *ids: int) -> None:
    await DeliveryRedis(client, stream_key=settings.stream_key).add_to_stream(ids, maxlen=1000)


async def group_pending(client, settings) -> int:
    return (await client.xpending(settings.stream_key, settings.consumer_group))["pending"]


async def test_entries_are_forwarded_then_acked_and_trimmed(
    bridge_factory, delivery_redis, delivery_settings
):
    recorder = Recorder()
    await add(delivery_redis, delivery_settings, 1, 2, 3)
    running = bridge_factory(recorder)
    await wait_until(lambda: len(recorder.ids) == 3)
    await running.stop()
    assert recorder.ids == [1, 2, 3]
    assert recorder.batches == [[1, 2, 3]]  # one actor message per read
    assert await group_pending(delivery_redis, delivery_settings) == 0
    assert await delivery_redis.xlen(delivery_settings.stream_key) == 0


async def test_group_creation_tolerates_an_existing_group(delivery_redis, delivery_settings):
    bridge = StreamBridge(delivery_redis, settings=delivery_settings, send=Recorder())
    await bridge.ensure_group()
    await bridge.ensure_group()
    assert bridge.consumer == f"{os.uname().nodename}-{os.getpid()}"


async def test_malformed_entries_are_acked_and_counted_among_good_ones(
    bridge_factory, delivery_redis, delivery_settings
):
    key = delivery_settings.stream_key
    await add(delivery_redis, delivery_settings, 1)
    await delivery_redis.xadd(key, {"payload": "{not json"})
    await delivery_redis.xadd(key, {"payload": '{"other": 5}'})
    await delivery_redis.xadd(key, {"unrelated": "x"})
    await delivery_redis.xadd(key, {"payload": '{"message_id": -3}'})
    await add(delivery_redis, delivery_settings, 2)
    recorder = Recorder()
    running = bridge_factory(recorder)
    await wait_until(lambda: running.bridge.malformed == 4 and len(recorder.ids) == 2)
    await running.stop()
    assert recorder.ids == [1, 2]
    assert await group_pending(delivery_redis, delivery_settings) == 0


async def test_failed_sends_stay_pending_and_are_retried(
    bridge_factory, delivery_redis, delivery_settings
):
    recorder = Recorder()
    recorder.failing = True
    running = bridge_factory(recorder)
    await add(delivery_redis, delivery_settings, 1, 2)
    await wait_until(lambda: running.bridge._own_pending)
    await asyncio.sleep(0.2)
    assert await group_pending(delivery_redis, delivery_settings) == 2
    recorder.failing = False
    await wait_until(lambda: recorder.ids == [1, 2])
    await running.stop()
    assert await group_pending(delivery_redis, delivery_settings) == 0


async def test_bridge_killed_between_enqueue_and_xack_sends_once(
    bridge_factory, delivery_redis, delivery_settings, delivery_sessions
):
    """The entry comes back through XAUTOCLAIM; the delivered fast path makes it one send."""
    message_id = await make_message(delivery_sessions)
    first = Recorder()

    class DiesBeforeAck(StreamBridge):
        async def _ack(self, entry_ids):
            raise SystemExit("killed")  # nothing after the actor message was sent

    doomed = DiesBeforeAck(
        delivery_redis, settings=delivery_settings, send=first, consumer="bridge-dead"
    )
    await add(delivery_redis, delivery_settings, message_id)
    with pytest.raises(SystemExit):
        await doomed.run()
    assert first.ids == [message_id]
    assert await group_pending(delivery_redis, delivery_settings) == 1

    second = Recorder()
    running = bridge_factory(second, consumer="bridge-2")
    await wait_until(lambda: second.ids == [message_id])  # after claim_idle_ms
    await running.stop()
    assert await group_pending(delivery_redis, delivery_settings) == 0

    # Both actor messages run: exactly one send.
    outbound = ScriptedOutbound()
    deliverer = Deliverer(
        sessions=delivery_sessions,
        redis=DeliveryRedis(delivery_redis, stream_key=delivery_settings.stream_key),
        outbound=outbound,
        settings=delivery_settings,
        owner=LockOwner("worker", started_at=1.0),
    )
    outcomes = [await deliverer.deliver(mid) for mid in first.ids + second.ids]
    assert outcomes == [Outcome.DELIVERED, Outcome.SETTLED]
    assert len(outbound.sent) == 1
    assert (await load_message(delivery_sessions, message_id)).attempts == 1


async def test_own_pending_entries_are_read_again_after_a_restart_of_the_loop(
    bridge_factory, delivery_redis, delivery_settings
):
    key, group = delivery_settings.stream_key, delivery_settings.consumer_group
    await delivery_redis.xgroup_create(key, group, id="0", mkstream=True)
    await add(delivery_redis, delivery_settings, 5)
    # Read by "bridge-1" earlier and never acknowledged.
    await delivery_redis.xreadgroup(group, "bridge-1", {key: ">"}, count=10)
    settings = delivery_settings.model_copy(update={"claim_idle_ms": 60_000})
    recorder = Recorder()
    running = bridge_factory(recorder, consumer="bridge-1", settings=settings)
    await wait_until(lambda: recorder.ids == [5])
    await running.stop()


async def test_bridge_survives_a_redis_restart(tmp_path: Path, delivery_settings, caplog):
    server = EmbeddedRedis(tmp_path / "redis").start()
    # No client retries: they would hide this short outage from the bridge's own
    # reconnect path, which is what this test is about (tests/faults covers retries).
    client = create_client(server.url, delivery_settings, RedisSettings(retry_attempts=0))
    probe = aioredis.Redis.from_url(server.url)
    try:
        recorder = Recorder()
        bridge = StreamBridge(client, settings=delivery_settings, send=recorder, consumer="b")
        task = asyncio.create_task(bridge.run())
        await add(probe, delivery_settings, 1)
        await wait_until(lambda: recorder.ids == [1])
        await probe.aclose()
        server.stop()
        await asyncio.sleep(0.5)  # the bridge sees the outage and backs off
        server.start()  # same port, same data folder (AOF)
        probe = aioredis.Redis.from_url(server.url)
        await add(probe, delivery_settings, 2)
        await wait_until(lambda: recorder.ids == [1, 2], timeout_s=20)
        assert bridge.outages >= 1
        # A line when the outage started (then one per back-off step at most), one at its end.
        lines = [r for r in caplog.records if r.name == "bridges.stream" and r.levelno >= 30]
        said = [r.getMessage().split(" is ")[-1][:11] for r in lines]
        assert said[0] == "unreachable" and said[-1] == "reachable a"
        assert said.count("reachable a") == 1
        assert f"Redis redis://127.0.0.1:{server.port}/0" in lines[0].getMessage()
        assert all(r.exc_info is None for r in lines)
        bridge.stop.set()
        await asyncio.wait_for(task, 5)
    finally:
        await probe.aclose()
        await client.aclose()
        server.stop()


def test_bridge_process_exits_0_on_sigterm(redis_url, delivery_settings, tmp_path):
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")},
        "MAILROOM_REDIS__URL": redis_url,
        "MAILROOM_BROKER__KIND": "redis",
        "MAILROOM_DELIVERY__STREAM_KEY": delivery_settings.stream_key,
        "MAILROOM_DELIVERY__READ_BLOCK_MS": "200",
    }
    process = subprocess.Popen(
        [sys.executable, "-c", "from mailroom.cli import app; app()", "bridge", "stream"],
        env=env,
        cwd=Path(__file__).parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    watchdog = threading.Timer(60, process.kill)  # readline must not hang the suite
    watchdog.start()
    try:
        output = b""
        while b"consuming" not in output and process.poll() is None:
            output += process.stdout.readline()
        assert b"consuming" in output, output
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
        rest = process.stdout.read()
        assert b"stopped" in rest, rest
    finally:
        watchdog.cancel()
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()


async def test_a_backlog_is_forwarded_in_order_and_every_entry_acknowledged(
    bridge_factory, delivery_redis, delivery_settings
):
    settings = delivery_settings.model_copy(update={"read_count": 5})
    ids = list(range(1, 24))
    await add(delivery_redis, settings, *ids)
    recorder = Recorder()
    running = bridge_factory(recorder, settings=settings)
    await wait_until(lambda: len(recorder.ids) == len(ids))
    # The acknowledgement of a backlog's last batch comes with the next read.
    await wait_until(lambda: not running.bridge._unacked)
    await running.stop()
    assert recorder.ids == ids
    assert [len(batch) for batch in recorder.batches] == [5, 5, 5, 5, 3]
    assert await group_pending(delivery_redis, settings) == 0
    assert await delivery_redis.xlen(settings.stream_key) == 0


async def test_stopping_mid_backlog_acknowledges_what_was_sent_and_loses_nothing(
    delivery_redis, delivery_settings
):
    settings = delivery_settings.model_copy(update={"read_count": 5})
    ids = list(range(1, 51))
    await add(delivery_redis, settings, *ids)
    stop = asyncio.Event()
    recorder = Recorder()

    def send(message_ids):
        recorder(message_ids)
        if len(recorder.batches) == 3:
            stop.set()  # SIGTERM while batches are read ahead

    bridge = StreamBridge(delivery_redis, settings=settings, send=send, consumer="b", stop=stop)
    await asyncio.wait_for(bridge.run(), 5)
    sent = set(recorder.ids)
    assert 15 <= len(sent) < len(ids)  # the batch read ahead is finished, nothing more
    pending = await delivery_redis.xpending_range(
        settings.stream_key, settings.consumer_group, min="-", max="+", count=100
    )
    assert pending == []  # everything read was sent and acknowledged
    left = await delivery_redis.xrange(settings.stream_key)
    assert sorted(sent | {decode_entry(fields) for _, fields in left}) == ids


async def test_a_bridge_deletes_consumers_long_idle_with_nothing_pending(
    delivery_redis, delivery_settings
):
    # Given the consumers two earlier bridges left: one with an entry pending, one with none
    settings = delivery_settings.model_copy(update={"consumer_forget_after_s": 0.2})
    key, group = settings.stream_key, settings.consumer_group
    bridge = StreamBridge(delivery_redis, settings=settings, send=Recorder(), consumer="me")
    await bridge.ensure_group()
    await delivery_redis.xgroup_createconsumer(key, group, "gone-empty")
    await delivery_redis.xgroup_createconsumer(key, group, "me")
    await add(delivery_redis, settings, 1)
    await delivery_redis.xreadgroup(group, "gone-holding", {key: ">"}, count=1)
    await asyncio.sleep(0.3)

    # When the bridge looks for them
    forgotten = await IdleConsumers(delivery_redis, settings).forget(keep="me")

    # Then only the idle one with nothing pending is gone; the one holding an entry stays
    names = {c["name"] for c in await delivery_redis.xinfo_consumers(key, group)}
    assert forgotten == ["gone-empty"]
    assert {n.decode() if isinstance(n, bytes) else n for n in names} == {"gone-holding", "me"}
