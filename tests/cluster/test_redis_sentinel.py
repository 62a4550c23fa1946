"""Mailroom on Redis with Sentinel: the primary SIGKILLed, a replica promoted, nothing lost."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from functools import partial

import dramatiq
import nats as nats_py
import pytest

from actors.broker.transport import broker_for, send_confirmed, set_sending_broker
from bridges.nats import NatsBridge
from mailroom.adapters.nats import NatsClient
from mailroom.adapters.redis_client import async_client, link_role, sync_client
from mailroom.devtools.clusters import REDIS_MASTER_NAME
from mailroom.devtools.seed import invoice_mails
from mailroom.queues import APPLY_RECOGNITION_MESSAGES
from mailroom.settings import RedisSettings, Settings
from tests.fixtures.recognition import make_settings

pytestmark = pytest.mark.cluster

#: Longest the flows below may take to finish once the primary was killed, in seconds.
RECOVERY_BOUND_S = 60.0


def _settings(group, **changes) -> RedisSettings:
    return RedisSettings(
        url=group.url(),
        sentinels=group.sentinel_addresses,
        sentinel_master=REDIS_MASTER_NAME,
        **changes,
    )


async def test_a_sentinel_client_follows_the_promoted_replica(redis_sentinels):
    # Given a client that asks the sentinels for the master, its retries (0.1 s doubled up
    # to 2 s, 8 of them: 9 s) longer than a failover (3 to 5 s on a loaded machine)
    settings = _settings(redis_sentinels, retry_attempts=8)
    client = async_client(settings.url, settings, decode_responses=True)
    try:
        before = await link_role(client)
        old = redis_sentinels.master()
        assert before == {
            "role": "master",
            "replicas": 1,
            "address": old.address,
            "master": REDIS_MASTER_NAME,
            "sentinels": redis_sentinels.sentinel_addresses,
        }
        # When the primary is killed while the client writes
        written = 0
        old.kill()
        deadline = time.monotonic() + 6.0
        while time.monotonic() < deadline:
            await client.incr("counter")
            written += 1
        # Then every write succeeded and is on the promoted replica
        new = redis_sentinels.wait_for_failover(old)
        assert int(await client.get("counter")) == written
        assert (await link_role(client))["address"] == new.address
    finally:
        await client.aclose()


def test_broker_sends_ride_a_failover(redis_sentinels, tmp_path):
    # Given the broker of a sending process on Sentinel (its client retries a command once)
    settings: Settings = make_settings(database_url="postgresql://unused", tmp_path=tmp_path)
    settings.redis = _settings(redis_sentinels)
    settings.broker.kind = "redis"
    settings.broker.namespace = "sentinel-test"
    # A send budget longer than any failover the fixture waits for: the promotion took
    # 2 to 5 s alone but over 10 s on a machine loaded by other test processes, and the test
    # is about sends riding it, not about how long the default budget is
    settings.broker.send_retry_s = 60.0
    broker = broker_for(settings, [])
    queue = "sentinel_test"
    broker.declare_queue(queue)
    sent, errors = [], []
    stop = threading.Event()

    def send_steadily() -> None:
        n = 0
        while not stop.is_set():
            message = dramatiq.Message(
                queue_name=queue, actor_name="noop", args=(n,), kwargs={}, options={}
            )
            try:
                broker.enqueue(message)
                sent.append(n)
            except Exception as exc:
                errors.append(exc)
            n += 1
            time.sleep(0.01)

    sender = threading.Thread(target=send_steadily)
    sender.start()
    try:
        # When the primary is killed mid-stream
        time.sleep(0.3)
        old = redis_sentinels.master()
        old.kill()
        redis_sentinels.wait_for_failover(old)
        time.sleep(0.5)
    finally:
        stop.set()
        sender.join()
        broker.close()
    # Then no send failed, and every sent message is in its queue on the new master
    assert errors == []
    client = sync_client(settings.redis.url, settings.redis)
    try:
        queued = [
            json.loads(data)["args"][0] for data in client.hvals(f"sentinel-test:{queue}.msgs")
        ]
    finally:
        client.close()
    assert sorted(set(queued)) == sent


# ``redis_sentinels`` before ``make_system``: the processes stop while their Redis answers.
def test_the_redis_primary_killed_during_delivery_loses_and_repeats_nothing(
    redis_sentinels, make_system
):
    mails = 12
    system = make_system(
        redis_url=redis_sentinels.url(),
        webhook_delay_s=0.3,
        MAILROOM_REDIS__SENTINELS=json.dumps(redis_sentinels.sentinel_addresses),
        MAILROOM_REDIS__SENTINEL_MASTER=REDIS_MASTER_NAME,
    )
    system.start_all()
    system.append(*invoice_mails(1, mails))
    system.wait_for(
        "a webhook send in flight",
        lambda: (
            system.scalar(
                "SELECT count(*) FROM channel_message WHERE channel = 'webhook' AND status = 'sending'"
            )
            > 0
        ),
        timeout_s=90,
    )
    old = redis_sentinels.master()
    old.kill()
    system.append(*invoice_mails(mails + 1, 4))
    total = mails + 4
    system.wait_for(
        "every notification delivered",
        lambda: (
            system.scalar("SELECT count(*) FROM channel_message WHERE status = 'delivered'")
            == 2 * total
        ),
        timeout_s=RECOVERY_BOUND_S,
    )
    time.sleep(1.0)  # a late second send, should one come, still counts
    posts = system.webhook.posts_per_key()
    ids = {
        row[0] for row in system.query("SELECT id FROM channel_message WHERE channel = 'webhook'")
    }
    assert {
        "messages": dict(
            system.query(
                "SELECT channel || ' ' || status, count(*) FROM channel_message GROUP BY 1"
            )
        ),
        "webhook keys missing": sorted({f"{mid}:1" for mid in ids} - set(posts)),
        "webhook POSTs per key above 1": {key: n for key, n in posts.items() if n != 1},
        "master": redis_sentinels.master() is not old,
    } == {
        "messages": {"log delivered": total, "webhook delivered": total},
        "webhook keys missing": [],
        "webhook POSTs per key above 1": {},
        "master": True,
    }


async def test_the_nats_bridge_acks_only_what_a_redis_replica_confirmed(
    redis_sentinels, nats_url, subject_prefix, tmp_path
):
    # Given the NATS bridge sending through a broker on Sentinel, whose replica stalls
    settings: Settings = make_settings(
        database_url="postgresql://unused",
        nats_url=nats_url,
        subject_prefix=subject_prefix,
        tmp_path=tmp_path,
    )
    settings.redis = _settings(redis_sentinels)
    settings.broker.kind = "redis"
    settings.broker.namespace = "bridge-test"
    settings.broker.replica_wait_ms = 300
    settings.nats.bridge_ack_wait_s = 2.0
    previous = dramatiq.get_broker()
    broker = set_sending_broker(settings)
    bridge = NatsBridge(
        NatsClient(settings.nats),
        partial(send_confirmed, APPLY_RECOGNITION_MESSAGES),
        settings=settings,
    )
    task = asyncio.create_task(bridge.run())
    nc = await nats_py.connect(servers=[nats_url])
    try:
        await asyncio.wait_for(bridge.ready.wait(), 30)
        replica = next(s for s in redis_sentinels.servers if s is not redis_sentinels.master())
        stall = threading.Thread(target=_debug_sleep, args=(replica.port, 1.5))
        stall.start()
        await asyncio.sleep(0.1)
        # When a result arrives while no replica can confirm its enqueue
        js = nc.jetstream()
        await js.publish(settings.nats.subject(settings.nats.results_subject), b"{}")
        await asyncio.sleep(1.0)
        # Then the bridge has not acked it (JetStream still holds it)...
        assert bridge.forwarded == 0
        info = await js.consumer_info(settings.nats.stream_name, settings.nats.inbox_durable)
        assert info.num_ack_pending == 1
        stall.join()
        # ...and forwards it once redelivered with the replica back
        deadline = time.monotonic() + 30
        while bridge.forwarded < 1:
            assert time.monotonic() < deadline, "not forwarded after the replica came back"
            await asyncio.sleep(0.1)
    finally:
        bridge.stop()
        await asyncio.wait_for(task, 30)
        await nc.close()
        broker.close()
        dramatiq.set_broker(previous)


def _debug_sleep(port: int, seconds: float) -> None:
    """Block a Redis server for ``seconds`` (it neither replicates nor answers)."""
    import redis

    with redis.Redis(port=port, socket_timeout=seconds + 5) as client:
        client.execute_command("DEBUG", "SLEEP", seconds)


async def test_the_redis_primary_killed_during_the_nats_bridges_enqueue_loses_no_batch(
    redis_sentinels, nats_url, subject_prefix, tmp_path
):
    # Given the NATS bridge enqueueing through a broker on Sentinel
    settings: Settings = make_settings(
        database_url="postgresql://unused",
        nats_url=nats_url,
        subject_prefix=subject_prefix,
        tmp_path=tmp_path,
    )
    settings.redis = _settings(redis_sentinels, retry_attempts=1)
    settings.broker.kind = "redis"
    settings.broker.namespace = "bridge-kill"
    settings.nats.bridge_ack_wait_s = 2.0
    previous = dramatiq.get_broker()
    broker = set_sending_broker(settings)
    bridge = NatsBridge(
        NatsClient(settings.nats),
        partial(send_confirmed, APPLY_RECOGNITION_MESSAGES),
        settings=settings,
    )
    task = asyncio.create_task(bridge.run())
    nc = await nats_py.connect(servers=[nats_url])
    total = 300
    try:
        await asyncio.wait_for(bridge.ready.wait(), 30)
        js = nc.jetstream()
        subject = settings.nats.subject(settings.nats.results_subject)
        old = redis_sentinels.master()
        # When the primary is SIGKILLed while results flow through the bridge
        for n in range(total):
            if n == total // 3:
                old.kill()
            await js.publish(subject, b"{}", headers={"Nats-Msg-Id": f"r:{n}"})
            await asyncio.sleep(0.005)
        redis_sentinels.wait_for_failover(old)
        # Then every result is in the inbox queue of the promoted master
        client = sync_client(settings.redis.url, settings.redis)
        deadline = time.monotonic() + RECOVERY_BOUND_S
        try:
            while True:
                ids = [
                    item["headers"]["Nats-Msg-Id"]
                    for data in client.hvals(f"bridge-kill:{APPLY_RECOGNITION_MESSAGES.queue}.msgs")
                    for item in json.loads(data)["args"][0]
                ]
                if len(set(ids)) == total or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
        finally:
            client.close()
        assert total - len(set(ids)) == 0, f"lost {total - len(set(ids))} of {total}"
        # A batch sent again after an unconfirmed enqueue is in the queue twice; the inbox
        # applies a message id once (tests/integration/test_recognition_inbox*.py).
        print(f"{len(ids) - len(set(ids))} results enqueued twice")
    finally:
        bridge.stop()
        await asyncio.wait_for(task, 30)
        await nc.close()
        broker.close()
        dramatiq.set_broker(previous)
