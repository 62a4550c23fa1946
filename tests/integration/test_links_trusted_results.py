"""Result objects come only from the configured results bucket, under a safe key, answering
the job's current attempt: anything else is refused by the inbox (a contract violation, or an
answer to no request of the job) and its object is never registered."""

from __future__ import annotations

import json
import logging
import uuid
from datetime import timedelta

import pytest

from mailroom.recognition.inbox.apply import apply_recognition_messages
from mailroom.recognition.inbox.messages import InboxMessage
from tests.fixtures.recognition import at

pytestmark = pytest.mark.integration

T0 = at("12:00:00")


def _result(ref, bucket: str, *, key: str | None = None, msg_id: str | None = None) -> InboxMessage:
    body = {
        "schema_version": "1.0",
        "job_id": str(ref.job_id),
        "file_id": ref.file_id,
        "status": "done",
        "service": {"name": "their-reader", "version": "0.1"},
        "result_s3": {"bucket": bucket, "key": key or f"mail/{ref.job_id}.eml"},
    }
    headers = {"Nats-Msg-Id": msg_id or f"{ref.job_id}:1:result"}
    return InboxMessage("files.tabular_parsed", json.dumps(body).encode(), headers)


async def _apply(db_sessions, recognition_settings, message):
    return await apply_recognition_messages(
        db_sessions,
        [message],
        max_bytes=4096,
        now=T0,
        results_bucket=recognition_settings.storage.results_bucket,
    )


async def _waiting(recognition_factory):
    return await recognition_factory.create_job(
        status="processing", published_at=T0, reply_deadline=T0 + timedelta(minutes=5)
    )


async def test_a_result_naming_another_bucket_fails_its_job_and_registers_nothing(
    db_sessions, recognition_factory, recognition_settings, mailroom_logs
):
    ref = await _waiting(recognition_factory)
    mail_bucket = recognition_settings.storage.mail_bucket

    [outcome] = await _apply(db_sessions, recognition_settings, _result(ref, mail_bucket))

    assert outcome.applied == "contract_violation" and outcome.map_job_id is None
    job = await recognition_factory.job(ref.job_id)
    assert (job["status"], job["error_code"]) == ("error", "RESULT_FOREIGN_BUCKET")
    assert f"result_s3 is in bucket {mail_bucket!r}" in job["error_message"]
    assert job["result_object_id"] is None
    assert (
        await recognition_factory.rows(
            "SELECT id FROM stored_object WHERE bucket = :b", {"b": mail_bucket}
        )
        == []
    )
    file = await recognition_factory.file(ref.file_id)
    assert file["status"] == "ERROR" and "RESULT_FOREIGN_BUCKET" in file["status_reason"]
    assert any("foreign_bucket" in line for line in mailroom_logs.messages())


async def test_a_result_in_the_results_bucket_is_applied_and_registered(
    db_sessions, recognition_factory, recognition_settings
):
    ref = await _waiting(recognition_factory)
    results_bucket = recognition_settings.storage.results_bucket

    [outcome] = await _apply(db_sessions, recognition_settings, _result(ref, results_bucket))

    assert outcome.applied == "result_applied" and outcome.map_job_id == ref.job_id
    rows = await recognition_factory.rows(
        "SELECT bucket_role FROM stored_object WHERE bucket = :b", {"b": results_bucket}
    )
    assert rows == [{"bucket_role": "results"}]


UNSAFE_KEYS = {
    "parent": "../x",
    "absolute": "/etc/passwd",
    "nul": "results/a\u0000b.json",
    "escape": "results/\u001b[31mred.json",
    "too_long": "\u00e9" * 600,  # 600 characters, 1200 bytes
}


@pytest.mark.parametrize("key", UNSAFE_KEYS.values(), ids=UNSAFE_KEYS.keys())
async def test_a_result_with_an_unsafe_key_fails_its_job_once_and_registers_nothing(
    db_sessions, recognition_factory, recognition_settings, mailroom_logs, key
):
    ref = await _waiting(recognition_factory)
    results_bucket = recognition_settings.storage.results_bucket

    [outcome] = await _apply(
        db_sessions, recognition_settings, _result(ref, results_bucket, key=key)
    )

    # A contract violation, not a crash to retry: the job ends at once, nothing is registered.
    assert outcome.applied == "contract_violation" and outcome.map_job_id is None
    job = await recognition_factory.job(ref.job_id)
    assert (job["status"], job["error_code"]) == ("error", "INVALID_RESULT")
    assert job["error_message"].startswith("unsafe_result_key: result_s3.key ")
    assert "\u0000" not in job["error_message"] and key not in job["error_message"]
    registered = await recognition_factory.rows(
        "SELECT id FROM stored_object WHERE bucket = :b", {"b": results_bucket}
    )
    assert registered == []
    assert not any(r.exc_info for r in mailroom_logs.records)
    warned = mailroom_logs.messages()
    assert any("unsafe_result_key" in line for line in warned)
    assert not any(r.levelno >= logging.ERROR for r in mailroom_logs.records)


@pytest.mark.parametrize("attempt", ["2", "0", "x"])
async def test_an_answer_under_another_attempt_is_not_applied(
    db_sessions, recognition_factory, recognition_settings, mailroom_logs, attempt
):
    ref = await _waiting(recognition_factory)
    bucket = recognition_settings.storage.results_bucket
    forged = _result(ref, bucket, key="r/1.json", msg_id=f"{ref.job_id}:{attempt}:result")

    [outcome] = await _apply(db_sessions, recognition_settings, forged)

    assert outcome.applied == "msg_id_mismatch" and outcome.map_job_id is None
    job = await recognition_factory.job(ref.job_id)
    assert (job["status"], job["result_msg_id"]) == ("processing", None)
    assert any("is not of attempt 1" in line for line in mailroom_logs.messages())

    genuine = _result(ref, bucket, key="r/1.json")
    [outcome] = await _apply(db_sessions, recognition_settings, genuine)
    assert outcome.applied == "result_applied"


async def test_an_answer_under_another_jobs_id_is_not_applied(
    db_sessions, recognition_factory, recognition_settings
):
    ref = await _waiting(recognition_factory)
    bucket = recognition_settings.storage.results_bucket
    forged = _result(ref, bucket, key="r/2.json", msg_id=f"{uuid.uuid4()}:1:result")

    [outcome] = await _apply(db_sessions, recognition_settings, forged)

    assert outcome.applied == "msg_id_mismatch"
    assert (await recognition_factory.job(ref.job_id))["status"] == "processing"
