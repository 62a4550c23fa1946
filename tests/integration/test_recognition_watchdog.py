"""The deadline watchdog against real Postgres."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import text

from mailroom.recognition.watchdog import expire_recognition_deadlines
from tests.fixtures.recognition import at

pytestmark = pytest.mark.integration

T0 = at("12:00:00")


async def test_jobs_past_their_deadline_time_out_and_their_current_files_fail(
    db_sessions, recognition_factory
):
    deadline = T0 - timedelta(seconds=1)
    published = await recognition_factory.create_job(status="published", reply_deadline=deadline)
    processing = await recognition_factory.create_job(status="processing", reply_deadline=deadline)
    in_time = await recognition_factory.create_job(
        status="processing", reply_deadline=T0 + timedelta(seconds=1)
    )
    done = await recognition_factory.create_job(
        status="done", reply_deadline=deadline, file_status="PROCESSING"
    )
    old_attempt = await recognition_factory.create_job(
        status="processing", reply_deadline=deadline, current=False
    )

    # Every job on its last attempt: a timeout settles the file (retries: the test below).
    outcome = await expire_recognition_deadlines(db_sessions, now=T0, automatic_attempts=1)

    assert sorted(outcome.timed_out) == sorted(
        [published.job_id, processing.job_id, old_attempt.job_id]
    )
    for ref in (published, processing):
        job = await recognition_factory.job(ref.job_id)
        assert (job["status"], job["error_code"], job["finished_at"]) == ("timeout", "TIMEOUT", T0)
        file = await recognition_factory.file(ref.file_id)
        assert file["status"] == "ERROR" and "TIMEOUT" in file["status_reason"]
    assert (await recognition_factory.job(in_time.job_id))["status"] == "processing"
    assert (await recognition_factory.job(done.job_id))["status"] == "done"
    assert (await recognition_factory.file(done.file_id))["status"] == "PROCESSING"
    assert (await recognition_factory.file(old_attempt.file_id))["status"] == "UPLOADED"
    assert sorted(outcome.finalized_mail_ids) == sorted([published.mail_id, processing.mail_id])


async def test_a_second_watchdog_pass_changes_nothing(db_sessions, recognition_factory):
    await recognition_factory.create_job(status="published", reply_deadline=T0 - timedelta(1))
    first = await expire_recognition_deadlines(db_sessions, now=T0)
    second = await expire_recognition_deadlines(db_sessions, now=T0 + timedelta(seconds=30))
    assert (len(first.timed_out), second.timed_out) == (1, [])


async def test_more_due_jobs_than_the_batch_size_all_time_out_across_batches(
    db_sessions, recognition_factory
):
    deadline = T0 - timedelta(seconds=1)
    refs = [
        await recognition_factory.create_job(status="published", reply_deadline=deadline)
        for _ in range(5)
    ]

    outcome = await expire_recognition_deadlines(
        db_sessions, now=T0, batch_size=2, automatic_attempts=1
    )

    assert sorted(outcome.timed_out) == sorted(ref.job_id for ref in refs)
    for ref in refs:
        assert (await recognition_factory.job(ref.job_id))["status"] == "timeout"
    assert sorted(outcome.finalized_mail_ids) == sorted(ref.mail_id for ref in refs)


async def test_a_job_locked_by_someone_else_is_skipped_not_waited_on(
    db_sessions, recognition_factory
):
    deadline = T0 - timedelta(seconds=1)
    held = await recognition_factory.create_job(status="processing", reply_deadline=deadline)
    free = await recognition_factory.create_job(status="processing", reply_deadline=deadline)

    async with db_sessions() as inbox, inbox.begin():
        # The inbox holds the row lock while it applies a result.
        await inbox.execute(
            text("SELECT id FROM recognition_job WHERE id = :id FOR UPDATE"), {"id": held.job_id}
        )
        outcome = await asyncio.wait_for(
            expire_recognition_deadlines(db_sessions, now=T0, batch_size=1), timeout=10
        )
    assert outcome.timed_out == [free.job_id]
    assert (await recognition_factory.job(held.job_id))["status"] == "processing"

    # Released and still due: the next pass takes it.
    later = await expire_recognition_deadlines(db_sessions, now=T0, batch_size=1)
    assert later.timed_out == [held.job_id]


async def test_a_timeout_is_retryable_re_sent_once_as_a_new_attempt_then_it_settles(
    db_sessions, recognition_factory
):
    deadline = T0 - timedelta(seconds=1)
    ref = await recognition_factory.create_job(status="processing", reply_deadline=deadline)

    first = await expire_recognition_deadlines(db_sessions, now=T0, automatic_attempts=2)

    assert first.timed_out == [ref.job_id] and first.finalized_mail_ids == []
    [replayed] = first.replayed
    assert (replayed.old_job_id, replayed.attempt) == (ref.job_id, 2)
    job = await recognition_factory.job(ref.job_id)
    assert (job["status"], job["error_code"]) == ("timeout", "TIMEOUT")
    file = await recognition_factory.file(ref.file_id)
    assert (file["status"], file["current_recognition_job_id"]) == (
        "UPLOADED",
        replayed.new_job_id,
    )
    assert (await recognition_factory.job(replayed.new_job_id))["status"] == "queued"
    [audit] = await recognition_factory.rows("SELECT * FROM audit_event")
    assert (audit["action"], audit["actor_id"]) == ("recognition.replayed", "recognition.watchdog")

    # The retry times out too: no attempt left, the file ends ERROR and its mail is final.
    await recognition_factory.set_job(
        replayed.new_job_id, status="processing", reply_deadline=deadline
    )
    second = await expire_recognition_deadlines(db_sessions, now=T0, automatic_attempts=2)

    assert (second.timed_out, second.replayed) == ([replayed.new_job_id], [])
    assert (await recognition_factory.file(ref.file_id))["status"] == "ERROR"
    assert second.finalized_mail_ids == [ref.mail_id]
