"""Result objects come only from the configured results bucket: a result naming another
bucket is refused by the inbox as a contract violation, and its object is never registered."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from mailroom.recognition.inbox.apply import apply_recognition_messages
from mailroom.recognition.inbox.messages import InboxMessage
from tests.fixtures.recognition import at

pytestmark = pytest.mark.integration

T0 = at("12:00:00")


def _result(ref, bucket: str) -> InboxMessage:
    body = {
        "schema_version": "1.0",
        "job_id": str(ref.job_id),
        "file_id": ref.file_id,
        "status": "done",
        "service": {"name": "their-reader", "version": "0.1"},
        "result_s3": {"bucket": bucket, "key": f"mail/{ref.job_id}.eml"},
    }
    return InboxMessage(
        "files.tabular_parsed", json.dumps(body).encode(), {"Nats-Msg-Id": f"{ref.job_id}:1:r"}
    )


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
