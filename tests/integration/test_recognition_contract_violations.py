"""A message off the contract that names a waiting job ends that job at once, loudly.

Not at the reply deadline as a TIMEOUT: the job is ``error``/``INVALID_RESULT``
with the reason, its file ERROR, its mail final (named for notification); a
WARNING without the body, a counter by service and reason, and one Sentry event
per service and reason however many messages break the same way.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from prometheus_client import REGISTRY
from pydantic import SecretStr

from mailroom.cli.status import collect_status
from mailroom.recognition.inbox.apply import apply_recognition_messages
from mailroom.recognition.inbox.messages import InboxMessage
from mailroom.settings import SentrySettings
from tests.fixtures.recognition import at
from tests.sentry_events import capturing_sentry

pytestmark = pytest.mark.integration

T0 = at("12:00:00")
SUBJECT = "files.tabular_parsed"


def _result(ref, **changes):
    message = {
        "schema_version": "1.0",
        "job_id": str(ref.job_id),
        "file_id": ref.file_id,
        "status": "done",
        "service": {"name": "their-reader", "version": "0.1"},
        "result_s3": {"bucket": "mailroom-results", "key": f"r/{ref.job_id}.json"},
    }
    message.update(changes)
    return {key: value for key, value in message.items() if value is not None}


def _message(ref, payload, kind="result"):
    return InboxMessage(
        SUBJECT, json.dumps(payload).encode(), {"Nats-Msg-Id": f"{ref.job_id}:1:{kind}"}
    )


async def _apply(sessions, *messages):
    return await apply_recognition_messages(sessions, list(messages), max_bytes=4096, now=T0)


def _violations(service, reason):
    value = REGISTRY.get_sample_value(
        "mailroom_recognition_contract_violations_total", {"service": service, "reason": reason}
    )
    return value or 0.0


@pytest.fixture
async def waiting(recognition_factory):
    async def make():
        return await recognition_factory.create_job(
            status="processing", published_at=T0, reply_deadline=T0 + timedelta(minutes=5)
        )

    return make


async def test_a_broken_result_for_a_waiting_job_fails_it_at_once_and_loudly(
    db_sessions, recognition_factory, recognition_settings, waiting, mailroom_logs
):
    first, second = await waiting(), await waiting()
    before = _violations("their-reader", "missing_result_s3")
    broken = [
        _message(ref, _result(ref, result_s3=None, secret="SECRET-BODY")) for ref in (first, second)
    ]

    dsn = SentrySettings(dsn=SecretStr("https://public@sentry.invalid/1"))
    with capturing_sentry(recognition_settings.model_copy(update={"sentry": dsn})) as sentry:
        outcomes = await _apply(db_sessions, *broken)

    assert [o.applied for o in outcomes] == ["contract_violation", "contract_violation"]
    for ref, outcome in zip((first, second), outcomes, strict=True):
        job = await recognition_factory.job(ref.job_id)
        assert (job["status"], job["error_code"]) == ("error", "INVALID_RESULT")
        assert job["error_message"].startswith("missing_result_s3: done without result_s3")
        file = await recognition_factory.file(ref.file_id)
        assert file["status"] == "ERROR" and "INVALID_RESULT" in file["status_reason"]
        assert outcome.finalized_mail_ids == (ref.mail_id,), "its mail is notified at once"
    warnings = [m for m in mailroom_logs.messages() if "broke the contract" in m]
    assert len(warnings) == 2 and all("SECRET-BODY" not in w for w in warnings)
    assert _violations("their-reader", "missing_result_s3") == before + 2
    # One event per service and reason within the window, not one per message.
    assert [e["tags"]["recognition.violation"] for e in sentry.events] == ["missing_result_s3"]
    assert "SECRET-BODY" not in json.dumps(sentry.events)
    # `mailroom status` lists them by service and code.
    report = await collect_status(recognition_settings)
    assert {"service": "their-reader", "code": "INVALID_RESULT", "jobs": 2}.items() <= (
        report["contract_violations"][0].items()
    )


async def test_a_message_off_the_contract_naming_no_known_job_changes_nothing(
    db_sessions, recognition_factory, waiting, mailroom_logs
):
    ref = await waiting()
    ghost = type(ref)(uuid.uuid4(), ref.file_id, None, None)

    [outcome] = await _apply(db_sessions, _message(ghost, _result(ghost, status="finished")))

    assert outcome.applied == "rejected"
    assert (await recognition_factory.job(ref.job_id))["status"] == "processing"
    [warning] = mailroom_logs.messages()
    assert "unknown or no longer waiting" in warning


async def test_an_answer_in_the_same_batch_wins_over_a_broken_message(
    db_sessions, recognition_factory, waiting
):
    ref = await waiting()
    broken_ack = _message(ref, _result(ref, status="processing", service="?"), kind="ack")

    outcomes = await _apply(db_sessions, broken_ack, _message(ref, _result(ref)))

    assert [o.applied for o in outcomes] == ["rejected", "result_applied"]
    job = await recognition_factory.job(ref.job_id)
    assert (job["status"], job["error_code"]) == ("done", None)
