"""The outbox publisher against real Postgres and real NATS (JetStream and core)."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta

import pytest
from sqlalchemy import text

from mailroom.adapters.nats import InMemoryPublisher, NatsClient
from mailroom.recognition.contract.models import MSG_ID_HEADER, RecognitionRequest
from mailroom.recognition.outbox.relay import publish_recognition_requests
from mailroom.service.wire import flushed
from tests.fixtures.recognition import at

pytestmark = pytest.mark.integration

T0 = at("12:00:00")


@pytest.fixture
async def nats_client(recognition_settings):
    client = NatsClient(recognition_settings.nats)
    await client.connect()
    yield client
    await client.close()


async def _pass(sessions, publisher, settings, now=T0, **kwargs):
    return await publish_recognition_requests(
        sessions,
        publisher,
        nats=settings.nats,
        recognition=settings.recognition,
        now=now,
        **kwargs,
    )


async def _wait_for(predicate, timeout_s=30.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_queued_job_is_published_with_its_msg_id_deadline_and_subject(
    db_sessions, recognition_factory, recognition_settings, nats_client, listener
):
    ref = await recognition_factory.create_job(original_name="März.csv", file_type="csv")

    outcome = await _pass(db_sessions, nats_client, recognition_settings)

    assert outcome.published == [ref.job_id]
    await _wait_for(lambda: len(listener) == 1)
    msg = listener[0]
    subject = recognition_settings.nats.subject("files.tabular_uploaded")
    assert msg.subject == subject
    assert msg.headers[MSG_ID_HEADER] == f"{ref.job_id}:1:request"
    request = RecognitionRequest.model_validate_json(msg.data)
    assert request.job_id == ref.job_id
    assert request.file_id == ref.file_id
    assert request.original_name == "März.csv"
    assert request.s3.bucket == "mailroom-incoming"
    assert request.reply_deadline == T0 + timedelta(seconds=300)
    job = await recognition_factory.job(ref.job_id)
    assert job["status"] == "published"
    assert job["published_at"] == T0
    assert job["reply_deadline"] == T0 + timedelta(seconds=300)
    assert job["request_msg_id"] == f"{ref.job_id}:1:request"
    assert job["request_subject"] == subject


async def test_image_jobs_go_to_the_image_subject(
    db_sessions, recognition_factory, recognition_settings, nats_client, listener
):
    await recognition_factory.create_job(
        pipeline="image", original_name="scan.pdf", file_type="pdf"
    )

    await _pass(db_sessions, nats_client, recognition_settings)

    await _wait_for(lambda: len(listener) == 1)
    assert listener[0].subject == recognition_settings.nats.subject("files.img_uploaded")


async def test_core_nats_publish_reaches_subscribers(
    database_url, nats_url, subject_prefix, tmp_path, recognition_factory
):
    from tests.fixtures.recognition import make_settings

    settings = make_settings(
        database_url=database_url,
        nats_url=nats_url,
        subject_prefix=subject_prefix,
        tmp_path=tmp_path,
        jetstream=False,
    )
    import nats as nats_py

    nc = await nats_py.connect(nats_url)
    sub = await nc.subscribe(settings.nats.subject("files.tabular_uploaded"))
    await flushed(nc)  # the server knows the SUB before anything is published
    client = NatsClient(settings.nats)
    await client.connect()
    try:
        ref = await recognition_factory.create_job()
        outcome = await _pass(recognition_factory.sessions, client, settings)
        msg = await sub.next_msg(timeout=20)
    finally:
        await client.close()
        await nc.close()
    assert outcome.published == [ref.job_id]
    assert msg.headers[MSG_ID_HEADER] == f"{ref.job_id}:1:request"


async def test_unacked_job_is_republished_with_the_same_msg_id_after_the_ack_timeout(
    db_sessions, recognition_factory, recognition_settings, nats_client, listener
):
    ref = await recognition_factory.create_job(metrics={"note": "kept"})
    await _pass(db_sessions, nats_client, recognition_settings)

    early = await _pass(
        db_sessions, nats_client, recognition_settings, now=T0 + timedelta(seconds=29)
    )
    late = await _pass(
        db_sessions, nats_client, recognition_settings, now=T0 + timedelta(seconds=31)
    )

    assert early.claimed == 0
    assert late.republished == [ref.job_id]
    assert late.duplicates == 1, "JetStream drops the copy inside its duplicate window"
    await _wait_for(lambda: len(listener) == 2)
    assert {m.headers[MSG_ID_HEADER] for m in listener} == {f"{ref.job_id}:1:request"}
    job = await recognition_factory.job(ref.job_id)
    assert job["metrics"] == {"note": "kept", "republish_count": 1}
    assert job["status"] == "published"
    assert job["published_at"] == T0, "published_at keeps the first publish"
    # The next republish waits one more ack timeout.
    again = await _pass(
        db_sessions, nats_client, recognition_settings, now=T0 + timedelta(seconds=59)
    )
    assert again.claimed == 0


async def test_non_object_metrics_count_as_empty_on_republish(
    db_sessions, recognition_factory, recognition_settings
):
    ref = await recognition_factory.create_job(
        status="published",
        published_at=T0,
        reply_deadline=T0 + timedelta(minutes=5),
        metrics=[1, 2],
    )
    publisher = InMemoryPublisher()

    outcome = await _pass(
        db_sessions, publisher, recognition_settings, now=T0 + timedelta(seconds=31)
    )

    assert outcome.republished == [ref.job_id]
    assert (await recognition_factory.job(ref.job_id))["metrics"] == {"republish_count": 1}


async def test_job_past_the_maximum_republishes_is_dead_lettered_and_its_file_fails(
    db_sessions, recognition_factory, recognition_settings
):
    ref = await recognition_factory.create_job()
    publisher = InMemoryPublisher()
    await _pass(db_sessions, publisher, recognition_settings)
    for n in range(1, 4):
        outcome = await _pass(
            db_sessions, publisher, recognition_settings, now=T0 + timedelta(seconds=30 * n + 1)
        )
        assert outcome.republished == [ref.job_id]

    outcome = await _pass(
        db_sessions, publisher, recognition_settings, now=T0 + timedelta(seconds=121)
    )

    assert outcome.dead_lettered == [ref.job_id]
    assert len(publisher.published) == 4
    job = await recognition_factory.job(ref.job_id)
    assert (job["status"], job["error_code"]) == ("dlq", "NO_ACK")
    assert job["metrics"]["republish_count"] == 3
    assert job["finished_at"] is not None
    assert (await recognition_factory.file(ref.file_id))["status"] == "ERROR"
    assert outcome.finalized_mail_ids == [ref.mail_id], "a dlq file is final for its mail"
    assert (await recognition_factory.mail(ref.mail_id))["status"] == "final"


async def test_no_republish_once_the_reply_deadline_passed(
    db_sessions, recognition_factory, recognition_settings
):
    await recognition_factory.create_job(
        status="published", published_at=T0, reply_deadline=T0 + timedelta(seconds=40)
    )
    outcome = await _pass(
        db_sessions, InMemoryPublisher(), recognition_settings, now=T0 + timedelta(seconds=41)
    )
    assert outcome.claimed == 0


async def test_request_that_cannot_be_built_fails_the_job_and_its_file(
    db_sessions, recognition_factory, recognition_settings
):
    ref = await recognition_factory.create_job(with_object=False)
    publisher = InMemoryPublisher()

    outcome = await _pass(db_sessions, publisher, recognition_settings)

    assert outcome.invalid == [ref.job_id]
    assert publisher.published == []
    job = await recognition_factory.job(ref.job_id)
    assert (job["status"], job["error_code"]) == ("error", "INVALID_REQUEST")
    assert "s3" in job["error_message"]
    assert (await recognition_factory.file(ref.file_id))["status"] == "ERROR"


async def test_pass_is_skipped_without_a_nats_connection(
    db_sessions, recognition_factory, recognition_settings
):
    ref = await recognition_factory.create_job()
    disconnected = NatsClient(recognition_settings.nats)  # never connected

    first = await _pass(db_sessions, InMemoryPublisher(connected=False), recognition_settings)
    second = await _pass(db_sessions, disconnected, recognition_settings)

    assert first.skipped and second.skipped
    assert (await recognition_factory.job(ref.job_id))["status"] == "queued"


async def test_publish_error_rolls_back_that_job_and_ends_the_pass(
    db_sessions, recognition_factory, recognition_settings
):
    refs = [await recognition_factory.create_job() for _ in range(3)]
    publisher = InMemoryPublisher(fail_at=1)

    outcome = await _pass(db_sessions, publisher, recognition_settings)

    assert outcome.published == [refs[0].job_id]
    assert outcome.failed == [refs[1].job_id, refs[2].job_id]
    assert outcome.error is not None and not outcome.more
    statuses = [(await recognition_factory.job(r.job_id))["status"] for r in refs]
    assert statuses == ["published", "queued", "queued"]


async def test_pass_handles_at_most_the_batch_size_and_asks_for_more(
    db_sessions, recognition_factory, recognition_settings
):
    for _ in range(5):
        await recognition_factory.create_job()
    publisher = InMemoryPublisher()

    first = await _pass(db_sessions, publisher, recognition_settings, limit=3)
    second = await _pass(db_sessions, publisher, recognition_settings, limit=3)

    assert (len(first.published), first.more) == (3, True)
    assert (len(second.published), second.more) == (2, False)


class _SlowPublisher(InMemoryPublisher):
    """Holds its batch (and so the row locks) until released."""

    def __init__(self, release: asyncio.Event, started: asyncio.Event | None = None) -> None:
        super().__init__()
        self.release = release
        self.started = started

    async def publish_batch(self, messages):
        if self.started is not None:
            self.started.set()
        await self.release.wait()
        return await super().publish_batch(messages)


async def test_parallel_publishers_never_publish_the_same_row(
    db_sessions, recognition_factory, recognition_settings
):
    refs = [await recognition_factory.create_job() for _ in range(40)]
    release = asyncio.Event()
    first_started = asyncio.Event()
    one, two = _SlowPublisher(release, first_started), _SlowPublisher(release)

    task_one = asyncio.create_task(_pass(db_sessions, one, recognition_settings, limit=25))
    await first_started.wait()  # publisher one holds 25 rows
    task_two = asyncio.create_task(_pass(db_sessions, two, recognition_settings, limit=25))
    await asyncio.sleep(0.2)
    release.set()
    outcomes = await asyncio.gather(task_one, task_two)

    ids_one = [m.msg_id for m in one.published]
    ids_two = [m.msg_id for m in two.published]
    assert len(ids_one) == 25 and len(ids_two) == 15
    assert not set(ids_one) & set(ids_two)
    assert sum(len(o.published) for o in outcomes) == len(refs)
    statuses = {(await recognition_factory.job(r.job_id))["status"] for r in refs}
    assert statuses == {"published"}


def _count_statements(sessions) -> list[str]:
    """Every statement the sessions' engine sends from now on (its first line)."""
    from sqlalchemy import event

    statements: list[str] = []
    engine = sessions.kw["bind"].sync_engine

    def record(conn, cursor, statement, parameters, context, executemany):
        statements.append(" ".join(statement.split()))

    event.listen(engine, "before_cursor_execute", record)
    return statements


async def test_pass_claims_the_oldest_first_in_statements_that_do_not_grow_with_its_jobs(
    db_sessions, recognition_factory, recognition_settings
):
    """No statement per job and no separate ``SELECT now()``: the claim brings the time."""
    times = [T0 + timedelta(minutes=m) for m in (3, 0, 2, 1, 4, 5)]
    refs = [await recognition_factory.create_job(requested_at=t) for t in times]
    publisher = InMemoryPublisher()
    statements = _count_statements(db_sessions)

    one = await _pass(db_sessions, publisher, recognition_settings, now=None, limit=1)
    for_one = len(statements)
    four = await _pass(db_sessions, publisher, recognition_settings, now=None, limit=4)

    oldest_first = [r.job_id for _, r in sorted(zip(times, refs, strict=True))]
    assert one.published + four.published == oldest_first[:5]
    assert len(statements) - for_one == for_one
    assert not [s for s in statements if re.fullmatch(r"SELECT now\(\)( AS \w+)?", s)]
    async with db_sessions() as session:
        db_time = await session.scalar(text("SELECT now()"))
    job = await recognition_factory.job(oldest_first[0])
    assert job["published_at"] <= db_time
    assert job["reply_deadline"] == job["published_at"] + timedelta(
        seconds=recognition_settings.recognition.reply_deadline_s
    )


async def test_array_parameters_keep_any_text_and_every_uuid(db_sessions):
    import uuid

    from mailroom.db.params import text_array, uuid_array

    texts = ["plain", 'a "quoted", {braced} value', "back\\slash", "", "NULL", " spaced "]
    ids = [uuid.uuid4() for _ in range(3)]
    async with db_sessions() as session:
        got_texts = await session.scalar(
            text("SELECT CAST(:v AS text[])"), {"v": text_array(texts)}
        )
        got_ids = await session.scalar(text("SELECT CAST(:v AS uuid[])"), {"v": uuid_array(ids)})
        empty = await session.scalar(text("SELECT CAST(:v AS uuid[])"), {"v": uuid_array([])})
    assert (got_texts, got_ids, empty) == (texts, ids, [])
