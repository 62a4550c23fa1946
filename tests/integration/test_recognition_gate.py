"""The recognition health gate holds jobs while no service answers, and lets them go after.

Real Postgres and NATS (JetStream), the reference recognizer in-process; the
database-side clock is moved by hand (``now=``) so minutes of silence take no time.
The recognizer's answers are read off the results subject and applied through the
real inbox at the test's clock, as the NATS bridge would.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import nats as nats_py
import pytest
from prometheus_client import REGISTRY
from pydantic import SecretStr

from actors.recognition import expire_recognition_deadlines as watchdog_actor
from actors.recognition import publish_recognition_requests as outbox_actor
from mailroom.adapters.nats import InMemoryPublisher, NatsClient
from mailroom.adapters.nats.publisher import OutgoingMessage
from mailroom.adapters.storage import build_store, content_key
from mailroom.cli.status import collect_status
from mailroom.recognition.contract.models import RecognitionRequest
from mailroom.recognition.gate import UNREAD_REASON, check_gate
from mailroom.recognition.inbox.apply import InboxMessage, apply_recognition_messages
from mailroom.recognition.outbox.relay import publish_recognition_requests
from mailroom.recognition.watchdog import expire_recognition_deadlines
from mailroom.recognizer.service import ReferenceRecognizer
from mailroom.service.wire import flushed
from mailroom.settings import SentrySettings
from tests.fixtures.recognition import at
from tests.fixtures.recognition import drain_recognition as drain
from tests.sentry_events import capturing_sentry

pytestmark = pytest.mark.integration

T0 = at("12:00:00")


@pytest.fixture
async def nats_client(recognition_settings):
    client = NatsClient(recognition_settings.nats)
    await client.connect()
    yield client
    await client.close()


@pytest.fixture
async def answers(recognition_settings):
    """Every message on the results subject, as the inbox takes them."""
    nc = await nats_py.connect(recognition_settings.nats.url)
    got: list[InboxMessage] = []

    async def collect(msg):
        got.append(InboxMessage(msg.subject, msg.data, dict(msg.headers or {})))

    nats = recognition_settings.nats
    await nc.subscribe(nats.subject(nats.results_subject), cb=collect)
    await flushed(nc)
    yield got
    await nc.close()


@pytest.fixture
def store(recognition_settings):
    return build_store(recognition_settings)


async def csv_job(factory, store, number):
    """A queued tabular job whose file (its own bytes) the recognizer can read."""
    ref = await factory.create_job()
    csv = f"invoice_number,total\nINV-{number},10.5\n".encode()
    stored = await store.put(
        "incoming", content_key(csv, prefix="t", suffix=".csv"), csv, media_type="text/csv"
    )
    await factory.rows(
        "UPDATE stored_object SET bucket = :bucket, key = :key WHERE id = :id RETURNING id",
        {"bucket": stored.bucket, "key": stored.key, "id": ref.object_id},
    )
    return ref


async def step(sessions, publisher, settings, now):
    """What the scheduler's outbox sweep and watchdog do at ``now``, gate first."""
    state = await check_gate(sessions, recognition=settings.recognition, now=now)
    run = {"nats": settings.nats, "recognition": settings.recognition}
    outbox = await publish_recognition_requests(
        sessions, publisher, now=now, held=state.held, **run
    )
    watchdog = await expire_recognition_deadlines(sessions, now=now, held=state.held)
    return state, outbox, watchdog


def _gauge(pipeline):
    return REGISTRY.get_sample_value("mailroom_recognition_gate_closed", {"pipeline": pipeline})


async def wait_for(predicate, timeout_s=20.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_gate_holds_while_no_service_answers_and_resumes_when_one_does(
    db_sessions, recognition_factory, recognition_settings, nats_client, answers, store
):
    settings = recognition_settings  # ack 30 s x (3 + 1), deadline 300 s, silence 60 s
    first = await csv_job(recognition_factory, store, 1)
    second = await csv_job(recognition_factory, store, 2)
    dsn = SentrySettings(dsn=SecretStr("https://public@sentry.invalid/1"))

    with capturing_sentry(settings.model_copy(update={"sentry": dsn})) as sentry:
        state, outbox, _ = await step(db_sessions, nats_client, settings, T0)
        assert sorted(outbox.published) == sorted([first.job_id, second.job_id])
        state, outbox, _ = await step(
            db_sessions, nats_client, settings, T0 + timedelta(seconds=31)
        )
        assert not state.held and len(outbox.republished) == 2, "open: the no-ack window runs"

        state, outbox, _ = await step(
            db_sessions, nats_client, settings, T0 + timedelta(seconds=61)
        )
        assert state.closed_now == ["tabular"] and "answered for 60 s" in state.reasons["tabular"]
        assert outbox.republished == [] and outbox.probed == [first.job_id]
        assert _gauge("tabular") == 1
        # Far past the no-ack window (120 s) and the reply deadline (331 s): nothing burns.
        for seconds in range(91, 1000, 60):
            state, outbox, watchdog = await step(
                db_sessions, nats_client, settings, T0 + timedelta(seconds=seconds)
            )
            assert state.held == {"tabular"} and state.closed_now == []
            assert (outbox.republished, outbox.dead_lettered, watchdog.timed_out) == ([], [], [])
            assert outbox.probed == [first.job_id]

    assert [e["message"] for e in sentry.events] == [
        "Recognition gate closed for tabular: jobs held"
    ]
    for ref in (first, second):
        job = await recognition_factory.job(ref.job_id)
        assert (job["status"], job["metrics"]["republish_count"]) == ("published", 1)
        assert (await recognition_factory.file(ref.file_id))["status"] == "UPLOADED"
    report = await collect_status(settings)
    assert [g["pipeline"] for g in report["recognition_gate"]] == ["tabular"]

    # A service comes back: it only hears new requests, and the probe is one.
    recognizer = ReferenceRecognizer(settings, store=store)
    await recognizer.start()
    try:
        back = T0 + timedelta(seconds=1000)
        state, outbox, _ = await step(db_sessions, nats_client, settings, back)
        assert state.held == {"tabular"} and outbox.probed == [first.job_id]
        await wait_for(lambda: len(answers) >= 2)
        await apply_recognition_messages(
            db_sessions, answers[:2], max_bytes=100_000, now=back + timedelta(seconds=1)
        )
        assert (await recognition_factory.job(first.job_id))["status"] == "done"

        reopened = back + timedelta(seconds=2)
        state, outbox, watchdog = await step(db_sessions, nats_client, settings, reopened)
        assert state.opened_now == ["tabular"] and not state.held and state.refreshed == 1
        waiting = await recognition_factory.job(second.job_id)
        assert waiting["reply_deadline"] >= reopened + timedelta(seconds=300)
        assert waiting["metrics"]["republish_count"] == 0
        assert waiting["metrics"]["gate_reopened"]["republishes_before"] == 1
        assert (outbox.republished, watchdog.timed_out) == ([], []), "a fresh no-ack window"
        assert _gauge("tabular") == 0

        # Flow goes on by itself: the next republish reaches the service, its answer applies.
        state, outbox, _ = await step(
            db_sessions, nats_client, settings, reopened + timedelta(seconds=31)
        )
        assert outbox.republished == [second.job_id]
        await wait_for(lambda: len(answers) >= 4)
        await apply_recognition_messages(
            db_sessions, answers[2:4], max_bytes=100_000, now=reopened + timedelta(seconds=32)
        )
    finally:
        await recognizer.stop()
    statuses = await recognition_factory.rows("SELECT status FROM recognition_job")
    assert [row["status"] for row in statuses] == ["done", "done"], "no dlq, no timeout"


async def test_watchdog_holds_jobs_while_nats_is_unreachable_then_gives_them_a_new_deadline(
    recognition_factory, recognition_resources, stub_broker, stub_worker, mailroom_logs
):
    nats_url = recognition_resources.nats.url
    overdue = await recognition_factory.create_job(
        status="published", published_at="2000-01-01", reply_deadline="2000-01-01"
    )
    # Another job's result a moment ago: a service answers, so only NATS closes the gate.
    await recognition_factory.create_job(
        status="done", result_msg_id="x:1:result", finished_at="now", mapped_at="now"
    )
    recognition_resources.nats.url = "nats://127.0.0.1:1"
    recognition_resources.nats.initial_connect_attempts = 1

    watchdog_actor.send()
    outbox_actor.send()
    await drain(stub_broker, stub_worker)

    job = await recognition_factory.job(overdue.job_id)
    assert job["status"] == "published", "no timeout while NATS is unreachable"
    gates = await recognition_factory.rows("SELECT * FROM recognition_gate ORDER BY pipeline")
    assert [g["reason"].startswith("NATS unreachable") for g in gates] == [True, True]
    closings = [m for m in mailroom_logs.messages() if "gate of tabular closed" in m]
    assert len(closings) == 1, "said once, not once per pass"

    recognition_resources.nats.url = nats_url
    watchdog_actor.send()
    await drain(stub_broker, stub_worker)

    job = await recognition_factory.job(overdue.job_id)
    assert job["status"] == "published" and job["reply_deadline"].year > 2000
    assert "gate_reopened" in job["metrics"]
    gates = await recognition_factory.rows("SELECT closed_at FROM recognition_gate")
    assert [g["closed_at"] for g in gates] == [None, None]


async def test_a_held_pipeline_still_publishes_new_requests_and_the_other_pipeline_runs_as_usual(
    db_sessions, recognition_factory, recognition_settings
):
    settings = recognition_settings
    queued = await recognition_factory.create_job()
    held_waiting = await recognition_factory.create_job(
        status="published", published_at=T0, reply_deadline=T0 + timedelta(seconds=300)
    )
    image = await recognition_factory.create_job(
        pipeline="image",
        file_type="png",
        status="published",
        published_at=T0,
        reply_deadline=T0 + timedelta(seconds=300),
        metrics={"republish_count": 3},
    )
    publisher = InMemoryPublisher()

    outbox = await publish_recognition_requests(
        db_sessions,
        publisher,
        nats=settings.nats,
        recognition=settings.recognition,
        now=T0 + timedelta(seconds=200),
        held={"tabular"},
    )

    assert outbox.published == [queued.job_id], "intake's new files still go out"
    assert outbox.probed == [held_waiting.job_id] and outbox.republished == []
    assert outbox.dead_lettered == [image.job_id], "the image pipeline is not held"
    probe = next(m for m in publisher.published if m.msg_id.startswith(str(held_waiting.job_id)))
    assert RecognitionRequest.model_validate_json(probe.data).reply_deadline == T0 + timedelta(
        seconds=500
    ), "the deadline the reopening gate will give"
    job = await recognition_factory.job(held_waiting.job_id)
    assert (job["status"], job["metrics"]) == ("published", {})


async def test_the_ack_clock_reads_an_index_of_the_acked_jobs_only(
    recognition_factory, db_sessions
):
    from sqlalchemy import text

    from mailroom.db.engine import autocommit
    from mailroom.recognition.gate import _CLOCK
    from tests.fixtures.plans import plan_nodes

    # Given one acked job and thousands of jobs still waiting for their acks
    await recognition_factory.create_job(status="processing", started_at=T0)
    waiting = await recognition_factory.create_job(status="published", published_at=T0)
    async with autocommit(db_sessions) as connection:
        await connection.execute(
            text(
                "INSERT INTO recognition_job (id, file_id, pipeline, status, attempt) "
                "SELECT gen_random_uuid(), file_id, pipeline, 'published', 1 + n "
                "FROM recognition_job, generate_series(1, 5000) AS n WHERE id = :id"
            ),
            {"id": waiting.job_id},
        )
        await connection.execute(text("VACUUM ANALYZE recognition_job"))
        entries = (
            await connection.execute(
                text("SELECT reltuples FROM pg_class WHERE relname = 'ix_recognition_job_acked'")
            )
        ).scalar_one()
        clock = str(_CLOCK).replace(":pipelines", "'{tabular}'")
        [plan] = (await connection.exec_driver_sql("EXPLAIN (FORMAT JSON) " + clock)).scalar_one()
        last_ack = (await connection.exec_driver_sql(clock)).one().last_ack

    # Then the ack index holds the acked job alone, and the gate's last ack comes from it
    assert entries == 1, "jobs waiting for their ack have no entry"
    indexes = {node.get("Index Name") for node in plan_nodes(plan["Plan"])}
    assert "ix_recognition_job_acked" in indexes, indexes
    assert last_ack == T0


async def test_answers_waiting_unread_in_jetstream_hold_every_job_until_a_bridge_reads_them(
    recognition_factory, recognition_resources, nats_client, stub_broker, stub_worker
):
    settings = recognition_resources
    overdue = await recognition_factory.create_job(
        status="processing", published_at="2000-01-01", reply_deadline="2000-01-01"
    )
    # The inbox's consumer, as the NATS bridge creates it; then the bridge is gone.
    subscription = await nats_client.subscribe_results()
    nats = settings.nats
    for number in range(3):
        await nats_client.publish(
            OutgoingMessage(nats.subject(nats.results_subject), b"{}", f"answer-{number}")
        )
    # Delivered nothing for as long as the bridge's ack wait (0 here: at once).
    settings.nats.bridge_ack_wait_s = 0

    dsn = SentrySettings(dsn=SecretStr("https://public@sentry.invalid/1"))
    with capturing_sentry(settings.model_copy(update={"sentry": dsn})) as sentry:
        watchdog_actor.send()
        await drain(stub_broker, stub_worker)
    assert sorted(e["message"] for e in sentry.events) == [
        f"Recognition {UNREAD_REASON}: jobs of {pipeline} held" for pipeline in ("image", "tabular")
    ]

    job = await recognition_factory.job(overdue.job_id)
    assert job["status"] == "processing", "no timeout while its answer may wait unread"
    gates = await recognition_factory.rows("SELECT reason FROM recognition_gate")
    assert [g["reason"] for g in gates] == [f"{UNREAD_REASON} (3 answers wait in JetStream)"] * 2
    assert REGISTRY.get_sample_value("mailroom_recognition_answers_unread") == 3

    # A bridge reads them: the gates open and the jobs get a fresh deadline.
    read = 0
    while read < 3:
        for message in await subscription.fetch(10, 2.0):
            await message.ack()
            read += 1
    await subscription.close()

    async def waiting() -> int:
        backlog = await nats_client.inbox_backlog()
        assert backlog is not None
        return backlog.waiting

    for _ in range(100):  # the acks reach the server a moment after they are sent
        if await waiting() == 0:
            break
        await asyncio.sleep(0.05)
    watchdog_actor.send()
    await drain(stub_broker, stub_worker)

    job = await recognition_factory.job(overdue.job_id)
    assert job["status"] == "processing" and job["reply_deadline"].year > 2000
    gates = await recognition_factory.rows("SELECT closed_at FROM recognition_gate")
    assert [g["closed_at"] for g in gates] == [None, None]
    assert REGISTRY.get_sample_value("mailroom_recognition_answers_unread") == 0
