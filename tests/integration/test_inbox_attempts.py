"""The inbox counts attempts on jobs before applying: a message that kills its worker still ends."""

from __future__ import annotations

import json

import pytest

from mailroom.recognition import attempts
from mailroom.recognition.inbox import apply_recognition_messages
from mailroom.recognition.inbox_messages import InboxMessage
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


async def died(sessions, job_ids, times, key=attempts.INBOX_ATTEMPTS):
    """Attempts that counted themselves and never came back, as a killed worker leaves them."""
    for _ in range(times):
        await attempts.count_attempts(sessions, job_ids, key)


async def test_applied_batches_leave_no_count(db_sessions, recognition_factory):
    a = await recognition_factory.create_job(status="processing")
    b = await recognition_factory.create_job(status="processing")

    outcomes = await apply(db_sessions, error_result(a), error_result(b))

    assert [o.applied for o in outcomes] == ["result_applied", "result_applied"]
    for ref in (a, b):
        assert "inbox_attempts" not in (await recognition_factory.job(ref.job_id))["metrics"]


async def test_a_job_whose_messages_keep_killing_the_worker_fails_and_its_batch_goes_on(
    db_sessions, recognition_factory
):
    poison = await recognition_factory.create_job(status="processing")
    other = await recognition_factory.create_job(status="processing")
    # The first death held the whole batch; later ones (one message at a time) only the poison.
    await died(db_sessions, [poison.job_id, other.job_id], 1, attempts.INBOX_BATCH_ATTEMPTS)
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

    # Redelivered again: the job stays failed, nothing is applied.
    again = await apply(db_sessions, error_result(poison))
    assert [o.applied for o in again] == ["attempts_exhausted"]
    assert (await recognition_factory.job(poison.job_id))["error_code"] == (
        "INBOX_ATTEMPTS_EXHAUSTED"
    )


async def test_batch_deaths_alone_never_fail_a_job(db_sessions, recognition_factory):
    # Each death held a batch with this job in it (e.g. beside the real poison, or a copy of it).
    ref = await recognition_factory.create_job(status="processing")
    await died(db_sessions, [ref.job_id], MAX + 2, attempts.INBOX_BATCH_ATTEMPTS)

    [outcome] = await apply(db_sessions, error_result(ref))

    assert outcome.applied == "result_applied"


async def test_fewer_deaths_than_the_maximum_still_apply(db_sessions, recognition_factory):
    ref = await recognition_factory.create_job(status="processing")
    await died(db_sessions, [ref.job_id], 1, attempts.INBOX_BATCH_ATTEMPTS)
    await died(db_sessions, [ref.job_id], MAX - 1)

    [outcome] = await apply(db_sessions, error_result(ref))

    assert outcome.applied == "result_applied"
    assert (await recognition_factory.job(ref.job_id))["metrics"]["inbox_attempts"] == MAX - 1
