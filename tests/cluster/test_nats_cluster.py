"""Mailroom on a three-server NATS cluster: an operator's stream is kept, a lost seed is ridden."""

from __future__ import annotations

import asyncio
import time
import uuid

import nats as nats_py
import pytest
from nats.js.api import StreamConfig

from actors.recognition import apply_recognition_messages
from bridges.nats import NatsBridge
from mailroom.adapters.nats import NatsClient
from mailroom.cli.status_links import jetstream_state
from mailroom.errors import NatsConfigError, NatsUnavailable
from mailroom.recognition.outbox.relay import publish_recognition_requests
from mailroom.service import AnswerPublisher
from mailroom.settings import NatsSettings, Settings
from tests.fixtures.recognition import at, make_settings

pytestmark = pytest.mark.cluster

#: Longest the tests wait for a flow to finish after a node was killed, in seconds.
RECOVERY_BOUND_S = 30.0
#: The outbox's clock: fixed, so no pass republishes what an earlier one published.
T0 = at("12:00:00")


def _settings(urls, **changes) -> NatsSettings:
    tag = uuid.uuid4().hex[:10]
    return NatsSettings(
        servers=urls,
        allow_anonymous=True,
        stream_name=f"OPS_{tag}",
        inbox_durable=f"inbox_{tag}",
        subject_prefix=f"t{tag}.",
        connect_timeout_s=1.0,
        reconnect_wait_s=0.2,
        bridge_fetch_timeout_s=0.2,
        **changes,
    )


async def test_an_operators_r3_stream_survives_a_mailroom_connect(nats_cluster):
    # Given an operator's R3 stream with its own limits and an extra subject
    settings = _settings(nats_cluster.urls, stream_replicas=3)
    nc = await nats_py.connect(servers=nats_cluster.urls)
    js = nc.jetstream()
    prefix = settings.subject_prefix
    operator_subjects = [f"{prefix}files.tabular_uploaded", f"{prefix}audit.>"]
    await js.add_stream(
        StreamConfig(
            name=settings.stream_name,
            subjects=operator_subjects,
            num_replicas=3,
            max_age=3600.0,
            duplicate_window=120.0,
        )
    )
    try:
        # When Mailroom connects (creating what it needs)
        client = NatsClient(settings, name="cluster-test")
        await client.connect()
        await client.close()

        # Then the stream is as the operator made it, plus the subjects Mailroom lacked
        config = (await js.stream_info(settings.stream_name)).config
        assert config.num_replicas == 3
        assert config.max_age == 3600.0
        assert config.duplicate_window == 120.0
        assert set(config.subjects) == {
            *operator_subjects,
            f"{prefix}files.img_uploaded",
            f"{prefix}files.tabular_parsed",
        }

        # And mailroom status names the replicas, the leader and no lagging peer
        stream = (await jetstream_state(Settings(nats=settings)))["stream"]
        assert (stream["replicas"], stream["lagging"]) == (3, [])
        assert stream["leader"] in {node.node for node in nats_cluster.nodes}

        # And a Mailroom that asks for one replica is refused in one line, the stream untouched
        lone = NatsClient(settings.model_copy(update={"stream_replicas": 1}))
        with pytest.raises(NatsConfigError, match=r"has 3 replicas and nats\.stream_replicas is 1"):
            await lone.connect()
        assert (await js.stream_info(settings.stream_name)).config.num_replicas == 3
    finally:
        await js.delete_stream(settings.stream_name)
        await nc.close()


async def test_a_bridge_rides_the_loss_of_its_only_seed_server(
    nats_cluster, database_url, tmp_path, stub_broker
):
    # Given a bridge that knows one server of the cluster, on an R3 stream
    seed = nats_cluster.nodes[0]
    settings = make_settings(database_url=database_url, tmp_path=tmp_path)
    # A batch whose ack died with the seed comes back after the ack wait: well inside the bound.
    settings.nats = _settings([seed.url], stream_replicas=3, bridge_ack_wait_s=5.0)
    bridge = NatsBridge(
        NatsClient(settings.nats), apply_recognition_messages.send, settings=settings
    )
    task = asyncio.create_task(bridge.run())
    await asyncio.wait_for(bridge.ready.wait(), 30)
    others = [node.url for node in nats_cluster.nodes[1:]]
    nc = await nats_py.connect(servers=others)
    js = nc.jetstream()
    subject = settings.nats.subject(settings.nats.results_subject)
    total = 400
    try:
        # When results flow and the seed server is killed halfway
        for n in range(total):
            if n == total // 2:
                seed.kill()
            await _publish(js, subject, n)

        # Then every result reaches the inbox queue (counted by id: a batch forwarded twice
        # makes the bridge's count reach the total before the last id came)
        def forwarded_ids() -> list[str]:
            return [
                item["headers"]["Nats-Msg-Id"]
                for message in list(stub_broker.queues["inbox"].queue)
                for item in _items(message)
            ]

        deadline = time.monotonic() + RECOVERY_BOUND_S
        while len(set(forwarded_ids())) < total and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        ids = forwarded_ids()
        assert len(set(ids)) == total, f"lost {total - len(set(ids))}"
        # A batch whose ack died with the seed is redelivered and forwarded again: at least
        # once by design, and the inbox applies a message id once (its own tests), so only
        # the answers that were in flight at the kill may come twice.
        assert len(ids) - total <= settings.nats.bridge_fetch_batch
    finally:
        bridge.stop()
        await asyncio.wait_for(task, 30)
        await nc.close()


async def _publish(js, subject: str, n: int) -> None:
    """Publish until the stream acknowledges (a leader election in between is retried)."""
    while True:
        try:
            await js.publish(subject, b"{}", headers={"Nats-Msg-Id": f"r:{n}"}, timeout=2.0)
            return
        except (nats_py.errors.Error, TimeoutError):
            await asyncio.sleep(0.1)


def _items(message):
    import json

    return json.loads(message)["args"][0]


async def test_answers_published_around_a_killed_stream_leader_all_reach_the_stream(
    nats_cluster,
):
    # Given Mailroom's R3 stream and the reference recognizer's way of answering
    settings = _settings(nats_cluster.urls, stream_replicas=3)
    client = NatsClient(settings, name="cluster-test")
    await client.connect()
    await client.close()
    nc = await nats_py.connect(servers=nats_cluster.urls)
    subject = settings.subject(settings.results_subject)
    answers = AnswerPublisher(nc, subject, timeout_s=2.0)
    js = nc.jetstream()
    total = 600
    try:
        # When the stream's leader is SIGKILLed while answers go out
        for n in range(total):
            if n == total // 3:
                leader = (await js.stream_info(settings.stream_name)).cluster.leader
                nats_cluster.node(leader).kill()
            await answers.publish(b"{}", f"job-{n}:1:result")
        # Then the stream holds each answer once
        info = await _stream_info(js, settings.stream_name)
        assert info.state.messages == total
        assert answers.captured
    finally:
        await nc.close()


async def _stream_info(js, name: str):
    """The stream's info, asked again while its new leader is not answering yet."""
    deadline = time.monotonic() + RECOVERY_BOUND_S
    while True:
        try:
            return await js.stream_info(name)
        except (nats_py.errors.Error, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_outbox_passes_around_a_killed_stream_leader_publish_each_request_once(
    nats_cluster, recognition_settings, db_sessions, recognition_factory
):
    # Given queued jobs and an outbox on the cluster's R3 stream
    settings = recognition_settings
    settings.nats = _settings(nats_cluster.urls, stream_replicas=3, publish_timeout_s=2.0)
    settings.recognition.publish_batch_size = 20
    jobs = [(await recognition_factory.create_job()).job_id for _ in range(120)]
    client = NatsClient(settings.nats, name="outbox-test")
    await client.connect()
    nc = await nats_py.connect(servers=nats_cluster.urls)
    js = nc.jetstream()
    published: list = []
    try:
        # When passes run while the stream's leader is SIGKILLed after the second one
        passes = 0
        deadline = time.monotonic() + RECOVERY_BOUND_S
        while len(published) < len(jobs):
            assert time.monotonic() < deadline, f"published {len(published)} of {len(jobs)}"
            if passes == 2:
                leader = (await js.stream_info(settings.nats.stream_name)).cluster.leader
                nats_cluster.node(leader).kill()
            passes += 1
            try:
                outcome = await publish_recognition_requests(
                    db_sessions,
                    client,
                    nats=settings.nats,
                    recognition=settings.recognition,
                    now=T0,
                )
            except NatsUnavailable:  # reconnecting: the actor is retried, as here
                await asyncio.sleep(0.2)
                continue
            published += outcome.published
            if outcome.failed or outcome.skipped:
                await asyncio.sleep(0.2)
        # Then each job was published once, and the stream holds each request once
        assert sorted(published) == sorted(jobs)
        info = await _stream_info(js, settings.nats.stream_name)
        assert info.state.messages == len(jobs)
    finally:
        await client.close()
        await nc.close()
