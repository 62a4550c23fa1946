"""Flow control between the outbox and the recognition services, on real Postgres, NATS, Redis.

Per pipeline at most ``max_unacked_per_pipeline`` requests are published and not yet
acked; the other jobs wait ``queued`` and an inbox batch that acks jobs runs the
publisher again while a window holds jobs back.
"""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import timedelta

import pytest
import redis.asyncio as aioredis

from actors.recognition import apply_recognition_messages, publish_recognition_requests
from mailroom.adapters.nats import InMemoryPublisher, NatsClient
from mailroom.recognition.contract.models import MSG_ID_HEADER, ack_msg_id
from mailroom.recognition.inbox.apply import apply_recognition_messages as apply_messages
from mailroom.recognition.inbox.messages import InboxMessage
from mailroom.recognition.outbox import window
from mailroom.recognition.outbox.relay import publish_recognition_requests as outbox_pass
from mailroom.settings import NatsSettings
from tests.fixtures.recognition import at, drain_recognition, make_settings

pytestmark = pytest.mark.integration

T0 = at("12:00:00")


@pytest.fixture
def recognition_settings(database_url, nats_url, subject_prefix, tmp_path, redis_url):
    settings = make_settings(
        database_url=database_url,
        nats_url=nats_url,
        subject_prefix=subject_prefix,
        tmp_path=tmp_path,
        max_unacked_per_pipeline=2,
    )
    settings.redis.url = redis_url
    return settings


async def _wait_for(predicate, timeout_s=30.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def _ack(settings, ref) -> InboxMessage:
    body = {
        "schema_version": "1.0",
        "job_id": str(ref.job_id),
        "file_id": ref.file_id,
        "status": "processing",
        "service": {"name": "slow-reader", "version": "1"},
    }
    subject = settings.nats.subject(settings.nats.results_subject)
    return InboxMessage(
        subject, json.dumps(body).encode(), {MSG_ID_HEADER: ack_msg_id(ref.job_id, 1)}
    )


async def _statuses(factory, refs) -> list[str]:
    return [(await factory.job(r.job_id))["status"] for r in refs]


async def test_the_window_publishes_w_jobs_per_pipeline_and_leaves_the_rest_queued(
    db_sessions, recognition_factory, recognition_settings, listener
):
    tabular = [await recognition_factory.create_job() for _ in range(5)]
    image = [
        await recognition_factory.create_job(pipeline="image", file_type="pdf") for _ in range(1)
    ]
    client = NatsClient(recognition_settings.nats)
    await client.connect()
    try:
        first = await outbox_pass(
            db_sessions,
            client,
            nats=recognition_settings.nats,
            recognition=recognition_settings.recognition,
            now=T0,
        )
        second = await outbox_pass(
            db_sessions,
            client,
            nats=recognition_settings.nats,
            recognition=recognition_settings.recognition,
            now=T0 + timedelta(seconds=1),
        )
    finally:
        await client.close()

    assert first.published == [tabular[0].job_id, tabular[1].job_id, image[0].job_id]
    assert first.window_full == ["tabular"], "the image window keeps a free place"
    assert not first.more
    assert await _statuses(recognition_factory, tabular) == ["published"] * 2 + ["queued"] * 3
    # A full window publishes nothing more; the waiting jobs have no clock running yet.
    assert (second.claimed, second.window_full) == (0, ["tabular"])
    waiting = await recognition_factory.job(tabular[2].job_id)
    assert (waiting["published_at"], waiting["reply_deadline"]) == (None, None)
    await _wait_for(lambda: len(listener) == 3)
    sent = {m.headers[MSG_ID_HEADER] for m in listener}
    assert sent == {f"{r.job_id}:1:request" for r in (*tabular[:2], *image)}


async def test_a_slow_service_under_a_backlog_gets_no_no_ack_dead_letter(
    db_sessions, recognition_factory, recognition_settings
):
    """12 jobs, a service that acks one every 0.5 s, no ack after 1.5 s republished, after
    3 s dead-lettered: all at once, the last six would be dead letters (see the next test)."""
    rec = recognition_settings.recognition
    rec.ack_timeout_s, rec.max_republish = 1.5, 1
    refs = [await recognition_factory.create_job() for _ in range(12)]
    outcomes = await _serve_slowly(db_sessions, recognition_factory, recognition_settings, refs)

    assert await _statuses(recognition_factory, refs) == ["processing"] * 12
    assert not [job for o in outcomes for job in o.dead_lettered]
    assert not [job for o in outcomes for job in o.republished]


async def test_without_a_window_the_same_backlog_turns_into_dead_letters(
    db_sessions, recognition_factory, recognition_settings
):
    """The defect the window removes: every job published at once waits unacked in line."""
    rec = recognition_settings.recognition
    rec.ack_timeout_s, rec.max_republish, rec.max_unacked_per_pipeline = 1.5, 1, 100
    refs = [await recognition_factory.create_job() for _ in range(12)]
    outcomes = await _serve_slowly(db_sessions, recognition_factory, recognition_settings, refs)

    assert [job for o in outcomes for job in o.dead_lettered] == [r.job_id for r in refs[6:]]


async def _serve_slowly(sessions, factory, settings, refs):
    """Every 0.5 s (the passes' clock): the service acks the oldest published job, then a
    pass runs, as the inbox's nudge would run it. Until no job is queued or published."""
    publisher = InMemoryPublisher()
    outcomes = []
    for step in range(60):
        now = T0 + timedelta(seconds=0.5 * step)
        published = [
            r for r, s in zip(refs, await _statuses(factory, refs), strict=True) if s == "published"
        ]
        if published:
            await apply_messages(
                sessions, [_ack(settings, published[0])], max_bytes=100_000, now=now
            )
        outcomes.append(
            await outbox_pass(
                sessions, publisher, nats=settings.nats, recognition=settings.recognition, now=now
            )
        )
        if not {"queued", "published"} & set(await _statuses(factory, refs)):
            return outcomes
    raise AssertionError("the backlog was not served")


async def test_republishes_still_dead_letter_when_nobody_answers_and_free_the_places(
    db_sessions, recognition_factory, recognition_settings
):
    refs = [await recognition_factory.create_job() for _ in range(3)]
    publisher = InMemoryPublisher()

    async def run(seconds: float):
        return await outbox_pass(
            db_sessions,
            publisher,
            nats=recognition_settings.nats,
            recognition=recognition_settings.recognition,
            now=T0 + timedelta(seconds=seconds),
        )

    assert (await run(0)).published == [refs[0].job_id, refs[1].job_id]
    for seconds in (31, 61, 91):
        assert (await run(seconds)).republished == [refs[0].job_id, refs[1].job_id]
    last = await run(121)
    assert last.dead_lettered == [refs[0].job_id, refs[1].job_id]
    assert last.more, "the dead letters freed places a queued job can take now"
    freed = await run(121)

    assert freed.published == [refs[2].job_id]
    jobs = [await recognition_factory.job(r.job_id) for r in refs]
    assert [(j["status"], j["error_code"]) for j in jobs[:2]] == [("dlq", "NO_ACK")] * 2
    assert jobs[2]["published_at"] == T0 + timedelta(seconds=121), "its clock starts now"


def _batch_item(settings, ref) -> dict:
    message = _ack(settings, ref)
    return {
        "subject": message.subject,
        "data": base64.b64encode(message.data).decode(),
        "headers": dict(message.headers),
    }


async def test_an_ack_frees_a_place_and_the_inbox_nudge_publishes_the_next_job(
    recognition_factory, recognition_resources, stub_broker, stub_worker, listener
):
    recognition_resources.recognition.max_unacked_per_pipeline = 1
    refs = [await recognition_factory.create_job() for _ in range(2)]
    publish_recognition_requests.send()
    await drain_recognition(stub_broker, stub_worker)
    assert await _statuses(recognition_factory, refs) == ["published", "queued"]
    redis = aioredis.Redis.from_url(recognition_resources.redis.url)
    try:
        assert await redis.ttl(window.waiting_key(recognition_resources.nats)) > 0
    finally:
        await redis.aclose()

    apply_recognition_messages.send([_batch_item(recognition_resources, refs[0])])
    await drain_recognition(stub_broker, stub_worker)

    assert await _statuses(recognition_factory, refs) == ["processing", "published"]
    await _wait_for(lambda: len(listener) == 2)
    assert listener[1].headers[MSG_ID_HEADER] == f"{refs[1].job_id}:1:request"


async def test_an_ack_sends_no_pass_while_no_window_holds_jobs_back(
    recognition_factory, recognition_resources, stub_broker, stub_worker
):
    recognition_resources.recognition.max_unacked_per_pipeline = 5
    sent = await recognition_factory.create_job()
    publish_recognition_requests.send()
    await drain_recognition(stub_broker, stub_worker)
    # A job queued without a nudge of its own: only a pass sent by the ack would publish it.
    unseen = await recognition_factory.create_job()

    apply_recognition_messages.send([_batch_item(recognition_resources, sent)])
    await drain_recognition(stub_broker, stub_worker)

    assert await _statuses(recognition_factory, [sent, unseen]) == ["processing", "queued"]


async def test_acks_request_one_pass_at_a_time_and_only_behind_a_full_window(redis_url):
    nats = NatsSettings(stream_name="T_window_mark")
    redis = aioredis.Redis.from_url(redis_url)
    unreachable = aioredis.Redis.from_url("redis://127.0.0.1:1", socket_connect_timeout=1)
    try:
        nothing_waits = await window.request_pass(redis, nats)
        await window.mark_waiting(redis, nats)
        first, coalesced = [await window.request_pass(redis, nats) for _ in range(2)]
        await window.pass_started(redis, nats)
        after_start = await window.request_pass(redis, nats)
        await window.mark_waiting(unreachable, nats)  # warned, not raised
        await window.pass_started(unreachable, nats)
        blind = await window.request_pass(unreachable, nats)
    finally:
        await redis.aclose()
        await unreachable.aclose()
    assert (nothing_waits, first, coalesced, after_start, blind) == (
        False,
        True,
        False,
        True,
        True,
    )
