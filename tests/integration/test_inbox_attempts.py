"""The inbox records its attempts before applying: a message that kills its worker still ends."""

from __future__ import annotations

import asyncio
import json
import uuid
from contextlib import asynccontextmanager

import psycopg
import pytest
from sqlalchemy import text

from mailroom.db.engine import libpq_dsn, psycopg_autocommit
from mailroom.db.params import uuid_array
from mailroom.recognition import attempts
from mailroom.recognition.inbox import apply as inbox
from mailroom.recognition.inbox import attempts as inbox_attempts
from mailroom.recognition.inbox import sql as inbox_sql
from mailroom.recognition.inbox import write as inbox_write
from mailroom.recognition.inbox.apply import apply_recognition_messages
from mailroom.recognition.inbox.messages import InboxMessage
from tests.fixtures.recognition import at

pytestmark = pytest.mark.integration

T0 = at("12:00:00")
MAX = 3


def error_result(ref) -> InboxMessage:
    body = {
        "schema_version": "1.0",
        "job_id": str(ref.job_id),
        "file_id": ref.file_id,
        "status": "error",
        "service": {"name": "reader", "version": "1"},
        "error": {"code": "BAD_FILE", "message": "cannot read"},
    }
    headers = {"Nats-Msg-Id": f"{ref.job_id}:1:result"}
    return InboxMessage("files.tabular_parsed", json.dumps(body).encode(), headers)


async def apply(sessions, *messages):
    return await apply_recognition_messages(
        sessions, list(messages), max_bytes=100_000, now=T0, max_attempts=MAX
    )


async def died(sessions, job_ids, times):
    """Attempts at one message alone that counted themselves and never came back."""
    for _ in range(times):
        await attempts.count_attempts(sessions, job_ids, attempts.INBOX_ATTEMPTS)


async def batch_died(sessions, job_ids, times=1):
    """Batches that recorded their attempt and never came back, as a killed worker leaves them."""
    for _ in range(times):
        await inbox_attempts.begin_batch(sessions, uuid.uuid4(), uuid_array(job_ids))


async def batch_rows(sessions, job_id) -> int:
    """Recorded batch attempts naming the job."""
    async with sessions() as session:
        return await session.scalar(
            text("SELECT count(*) FROM inbox_batch_attempt WHERE :id = ANY(job_ids)"),
            {"id": job_id},
        )


async def test_applied_batches_leave_no_count(db_sessions, recognition_factory):
    a = await recognition_factory.create_job(status="processing")
    b = await recognition_factory.create_job(status="processing")

    outcomes = await apply(db_sessions, error_result(a), error_result(b))

    assert [o.applied for o in outcomes] == ["result_applied", "result_applied"]
    for ref in (a, b):
        assert "inbox_attempts" not in (await recognition_factory.job(ref.job_id))["metrics"]


async def test_a_batch_gives_its_attempts_back_in_its_own_transaction(
    db_sessions, recognition_factory, monkeypatch
):
    """Applied, duplicate or late, the batch's recorded attempt goes with the batch's commit."""
    applied = await recognition_factory.create_job(status="processing", metrics={"keep": 1})
    done = await recognition_factory.create_job(
        status="done", result_msg_id=f"{uuid.uuid4()}:1:result", metrics={"keep": 2}
    )
    apart = []

    async def end_batch_apart(sessions, attempt_id):
        apart.append(attempt_id)

    monkeypatch.setattr(inbox, "end_batch_apart", end_batch_apart)
    outcomes = await apply(db_sessions, error_result(applied), error_result(done))

    assert [o.applied for o in outcomes] == ["result_applied", "result_late"]
    assert apart == [], "nothing was left to end in a transaction of its own"
    for ref in (applied, done):
        assert await batch_rows(db_sessions, ref.job_id) == 0
    # No attempt count left; the error's class is recorded beside what was there.
    assert (await recognition_factory.job(applied.job_id))["metrics"] == {
        "keep": 1,
        "error_class": "retryable",
    }
    late = await recognition_factory.job(done.job_id)
    assert late["metrics"] == {"keep": 2} and late["status"] == "done"


async def test_a_failed_batch_gives_its_attempts_back_after_its_messages_went_one_by_one(
    db_sessions, recognition_factory
):
    good = await recognition_factory.create_job(status="processing")
    poison = await recognition_factory.create_job(status="processing")
    refused = error_result(poison)
    # Postgres text cannot hold a NUL character: the batch's write-back fails.
    body = json.loads(refused.data)
    body["error"]["message"] = "bad \u0000 byte"
    refused = InboxMessage(refused.subject, json.dumps(body).encode(), refused.headers)

    outcomes = await apply(db_sessions, error_result(good), refused)

    assert [o.applied for o in outcomes] == ["result_applied", "failed"]
    for ref in (good, poison):
        assert await batch_rows(db_sessions, ref.job_id) == 0


async def test_a_batch_of_only_unchanged_jobs_ends_its_attempt_too(
    db_sessions, recognition_factory
):
    done = await recognition_factory.create_job(status="done", result_msg_id="x:1:result")

    [outcome] = await apply(db_sessions, error_result(done))

    assert outcome.applied == "result_late"
    assert await batch_rows(db_sessions, done.job_id) == 0


async def test_a_job_whose_messages_keep_killing_the_worker_fails_and_its_batch_goes_on(
    db_sessions, recognition_factory
):
    poison = await recognition_factory.create_job(status="processing")
    other = await recognition_factory.create_job(status="processing")
    # The first death held the whole batch; later ones (one message at a time) only the poison.
    await batch_died(db_sessions, [poison.job_id, other.job_id])
    await died(db_sessions, [poison.job_id], MAX)

    outcomes = await apply(db_sessions, error_result(poison), error_result(other))

    assert [o.applied for o in outcomes] == ["attempts_exhausted", "result_applied"]
    assert outcomes[0].finalized_mail_ids == (poison.mail_id,), "notified at once, not by a sweep"
    job = await recognition_factory.job(poison.job_id)
    assert (job["status"], job["error_code"]) == ("error", "INBOX_ATTEMPTS_EXHAUSTED")
    assert job["result_msg_id"] is None, "the message that killed the workers is not applied"
    file = await recognition_factory.file(poison.file_id)
    assert file["status"] == "ERROR"
    assert file["status_reason"].startswith("INBOX_ATTEMPTS_EXHAUSTED:")
    assert (await recognition_factory.mail(poison.mail_id))["status"] == "final"
    assert (await recognition_factory.job(other.job_id))["status"] == "error"
    assert (await recognition_factory.job(other.job_id))["error_code"] == "BAD_FILE"

    # Redelivered again: the job stays failed, nothing is applied. (Its messages all came back
    # one by one, so the copy goes the batch way and meets a final job: a late result.)
    again = await apply(db_sessions, error_result(poison))
    assert [o.applied for o in again] == ["result_late"]
    assert (await recognition_factory.job(poison.job_id))["error_code"] == (
        "INBOX_ATTEMPTS_EXHAUSTED"
    )


async def test_batch_deaths_alone_never_fail_a_job(db_sessions, recognition_factory):
    # Each death held a batch with this job in it (e.g. beside the real poison, or a copy of it).
    ref = await recognition_factory.create_job(status="processing")
    await batch_died(db_sessions, [ref.job_id], MAX + 2)

    [outcome] = await apply(db_sessions, error_result(ref))

    assert outcome.applied == "result_applied"


async def test_fewer_deaths_than_the_maximum_still_apply(db_sessions, recognition_factory):
    ref = await recognition_factory.create_job(status="processing")
    await batch_died(db_sessions, [ref.job_id])
    await died(db_sessions, [ref.job_id], MAX - 1)

    [outcome] = await apply(db_sessions, error_result(ref))

    assert outcome.applied == "result_applied"
    assert (await recognition_factory.job(ref.job_id))["metrics"]["inbox_attempts"] == MAX - 1


def ack(ref) -> InboxMessage:
    body = {
        "schema_version": "1.0",
        "job_id": str(ref.job_id),
        "file_id": ref.file_id,
        "status": "processing",
        "service": {"name": "reader", "version": "1"},
    }
    headers = {"Nats-Msg-Id": f"{ref.job_id}:1:ack"}
    return InboxMessage("files.tabular_parsed", json.dumps(body).encode(), headers)


async def test_an_ack_and_its_result_in_batches_side_by_side_both_go_the_batch_way(
    db_sessions, recognition_factory, monkeypatch
):
    """A live batch's count on a shared job is waited for, not taken for a death."""
    job = await recognition_factory.create_job(status="published")
    first_inside, release = asyncio.Event(), asyncio.Event()
    one_by_one = []
    real_batch, real_one_by_one = inbox._apply_batch, inbox._apply_one_by_one

    async def paused_batch(sessions, parsed, now, **kwargs):
        if not first_inside.is_set():
            first_inside.set()
            await release.wait()
        return await real_batch(sessions, parsed, now, **kwargs)

    async def recorded_one_by_one(sessions, parsed, now, **kwargs):
        one_by_one.append(len(parsed))
        return await real_one_by_one(sessions, parsed, now, **kwargs)

    monkeypatch.setattr(inbox, "_apply_batch", paused_batch)
    monkeypatch.setattr(inbox, "_apply_one_by_one", recorded_one_by_one)
    first = asyncio.create_task(apply(db_sessions, ack(job)))
    await first_inside.wait()
    second = asyncio.create_task(apply(db_sessions, error_result(job)))
    # The second batch either waits for the first's hold on the job, or (without the hold)
    # would have counted the first's attempt as a death and gone on one by one.
    async with db_sessions() as session:
        for _ in range(500):
            waiting = await session.scalar(
                text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
            )
            if waiting or second.done() or one_by_one:
                break
            await asyncio.sleep(0.01)
    release.set()
    outcomes = [*await first, *await second]

    assert [o.applied for o in outcomes] == ["ack_applied", "result_applied"]
    assert one_by_one == [], "neither batch was taken for the survivor of a death"
    assert await batch_rows(db_sessions, job.job_id) == 0


@asynccontextmanager
async def held(sessions, job_ids):
    """Hold the jobs as a live batch does (``inbox_sql.HOLD``), until the block ends."""
    async with psycopg_autocommit(sessions) as pg:
        hold = {"space": attempts.HELD_SPACE, "ids": uuid_array(job_ids), "timeout": "5s"}
        await pg.execute(inbox_sql.HOLD, hold)
        try:
            yield
        finally:
            await pg.execute(inbox_sql.RELEASE)


async def test_a_dead_batch_holding_a_job_lets_the_next_one_see_its_attempt(
    db_sessions, recognition_factory
):
    job = await recognition_factory.create_job(status="processing")
    other = await recognition_factory.create_job(status="processing")
    ids = uuid_array([job.job_id])
    # A batch that recorded itself and whose process died: its hold went with its connection.
    async with held(db_sessions, [job.job_id]):
        assert not await inbox_attempts.begin_batch(db_sessions, uuid.uuid4(), ids)

    async with held(db_sessions, [job.job_id, other.job_id]):
        mine = uuid.uuid4()
        both = uuid_array([job.job_id, other.job_id])
        dead_before = await inbox_attempts.begin_batch(db_sessions, mine, both)
        await inbox_attempts.end_batch_apart(db_sessions, mine)
    async with held(db_sessions, [other.job_id]):
        alone = await inbox_attempts.begin_batch(
            db_sessions, uuid.uuid4(), uuid_array([other.job_id])
        )

    assert dead_before, "the dead batch's row names one of the jobs"
    assert not alone, "a job no dead batch held is not a suspect"
    assert (
        await batch_rows(db_sessions, job.job_id),
        await batch_rows(db_sessions, other.job_id),
    ) == (1, 1)


async def test_a_batch_that_dies_after_locking_its_jobs_leaves_its_attempt_recorded(
    db_sessions, recognition_factory, database_url
):
    """The attempt is committed in the same round trip as the lock, before any work."""
    job = await recognition_factory.create_job(status="processing")
    pg = await psycopg.AsyncConnection.connect(libpq_dsn(database_url), autocommit=True)
    try:
        dead, jobs = await inbox_write.hold_and_lock(pg, uuid_array([job.job_id]), uuid.uuid4())
    finally:
        await pg.close()  # the worker died: its transaction and its hold go with the connection

    assert (dead, [j.id for j in jobs]) == (False, [job.job_id])
    assert await batch_rows(db_sessions, job.job_id) == 1
    [outcome] = await apply(db_sessions, error_result(job))
    assert outcome.applied == "result_applied"
    counted = (await recognition_factory.job(job.job_id))["metrics"]
    assert "inbox_attempts" not in counted, "applied alone, counted and given back"
    assert await batch_rows(db_sessions, job.job_id) == 0, "its message came back: not a suspect"


async def test_a_dead_batch_lets_go_of_a_job_once_its_messages_came_back_one_by_one(
    db_sessions, recognition_factory, monkeypatch
):
    first = await recognition_factory.create_job(status="processing")
    second = await recognition_factory.create_job(status="processing")
    later = await recognition_factory.create_job(status="published")
    # A batch holding two jobs died
    await batch_died(db_sessions, [first.job_id, second.job_id])
    one_by_one = []
    real_one_by_one = inbox._apply_one_by_one

    async def recorded_one_by_one(sessions, parsed, now, **kwargs):
        one_by_one.append(sorted(str(p.response.job_id) for p in parsed))
        return await real_one_by_one(sessions, parsed, now, **kwargs)

    monkeypatch.setattr(inbox, "_apply_one_by_one", recorded_one_by_one)

    # When the first job's result comes (one by one: the dead batch names its job) and applies
    [outcome] = await apply(db_sessions, error_result(first))
    assert outcome.applied == "result_applied"
    assert one_by_one == [[str(first.job_id)]]

    # Then the dead batch's row names only the job not seen since
    assert await batch_rows(db_sessions, first.job_id) == 0
    assert await batch_rows(db_sessions, second.job_id) == 1
    # and a batch with the first job and a new one goes the batch way; the second's goes alone
    await apply(db_sessions, error_result(first), ack(later))
    assert len(one_by_one) == 1
    [outcome] = await apply(db_sessions, error_result(second))
    assert outcome.applied == "result_applied"
    assert one_by_one[1:] == [[str(second.job_id)]]
    async with db_sessions() as session:
        assert await session.scalar(text("SELECT count(*) FROM inbox_batch_attempt")) == 0


async def test_a_death_one_by_one_leaves_the_dead_batchs_row_for_the_next_delivery(
    db_sessions, recognition_factory, monkeypatch
):
    poison = await recognition_factory.create_job(status="processing")
    await batch_died(db_sessions, [poison.job_id])

    async def killed(*args, **kwargs):
        raise SystemExit("the worker died applying it")

    # When the message kills its worker while it goes alone
    monkeypatch.setattr(inbox, "_apply_in_one_transaction", killed)
    with pytest.raises(SystemExit):
        await apply(db_sessions, error_result(poison))

    # Then its job is still a suspect: the next delivery goes one by one, counted again
    assert await batch_rows(db_sessions, poison.job_id) == 1


async def test_messages_applied_one_by_one_stand_when_the_dead_rows_cannot_be_settled(
    db_sessions, recognition_factory, monkeypatch, caplog
):
    ref = await recognition_factory.create_job(status="processing")
    await batch_died(db_sessions, [ref.job_id])
    # The settling statement fails (the database refuses it)
    monkeypatch.setattr(inbox_write, "_SETTLE_DEAD_BATCHES", ["SELECT 1/0"])

    [outcome] = await apply(db_sessions, error_result(ref))

    # Then the result is applied all the same, and the dead row stays for next time
    assert outcome.applied == "result_applied"
    assert (await recognition_factory.job(ref.job_id))["status"] == "error"
    assert await batch_rows(db_sessions, ref.job_id) == 1
    assert "Could not settle dead inbox batches: DivisionByZero" in caplog.text
    # and the connection went back clean: the next batch of that job applies
    [again] = await apply(db_sessions, error_result(ref))
    assert again.applied == "result_duplicate"
