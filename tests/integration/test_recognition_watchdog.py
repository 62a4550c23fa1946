"""The deadline watchdog against real Postgres."""

from __future__ import annotations

from datetime import timedelta

import pytest

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

    outcome = await expire_recognition_deadlines(db_sessions, now=T0)

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
