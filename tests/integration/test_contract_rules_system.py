"""The rule book as the system applies it: real inbox, mapping and watchdog on Postgres.

Each test has its twin on the checker's side (``test_recognizer_check_rules.py``): a string
``file_id`` fails the job, a file that needs a check is never re-sent, permanent errors are
never retried and retryable ones are, an answer without ``Nats-Msg-Id`` and a result before
its ack are accepted, and an answer of the previous contract version still works.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest

from mailroom.adapters.storage import build_store
from mailroom.recognition.inbox.apply import apply_recognition_messages
from mailroom.recognition.inbox.messages import InboxMessage
from mailroom.recognition.mapping.run import map_recognition_result
from mailroom.recognition.watchdog import expire_recognition_deadlines
from tests.fixtures.recognition import at

pytestmark = pytest.mark.integration

T0 = at("12:00:00")
SUBJECT = "files.tabular_parsed"
INVOICE = {
    "invoice_number": {"value": "INV-7", "confidence": 0.99},
    "total": {"value": 120.5, "confidence": 0.95},
}


@pytest.fixture
def store(recognition_settings):
    return build_store(recognition_settings)


@pytest.fixture
async def waiting(recognition_factory):
    async def make(**job):
        return await recognition_factory.create_job(
            status="processing", reply_deadline=T0 + timedelta(minutes=5), **job
        )

    return make


def _answer(ref, status="done", **changes):
    body = {
        "schema_version": "1.1",
        "job_id": str(ref.job_id),
        "file_id": ref.file_id,
        "status": status,
        "service": {"name": "their-reader", "version": "0.1"},
    }
    body.update(changes)
    return {key: value for key, value in body.items() if value is not None}


def _message(ref, body, kind="result", msg_id=True):
    headers = {"Nats-Msg-Id": f"{ref.job_id}:1:{kind}"} if msg_id else {}
    return InboxMessage(SUBJECT, json.dumps(body).encode(), headers)


async def _apply(sessions, *messages):
    return await apply_recognition_messages(sessions, list(messages), max_bytes=100_000, now=T0)


async def _map(sessions, store, settings, job_id):
    return await map_recognition_result(
        sessions, store, job_id, settings=settings.recognition, now=T0
    )


async def _document(store, ref, fields):
    key = f"results/{ref.job_id}.json"
    data = {"job_id": str(ref.job_id), "document_type": "invoice", "fields": fields}
    await store.put("results", key, json.dumps(data).encode(), media_type="application/json")
    return {"bucket": store.bucket("results"), "key": key}


# --- point 1: a string file_id ------------------------------------------------------------


async def test_a_string_file_id_fails_the_job_as_invalid_result_and_is_not_retried(
    db_sessions, recognition_factory, waiting
):
    ref = await waiting()
    broken = _answer(ref, status="error", file_id=str(ref.file_id))

    [outcome] = await _apply(db_sessions, _message(ref, broken))

    assert outcome.applied == "contract_violation"
    job = await recognition_factory.job(ref.job_id)
    assert (job["status"], job["error_code"]) == ("error", "INVALID_RESULT")
    assert "file_id" in job["error_message"]
    assert (await recognition_factory.file(ref.file_id))["status"] == "ERROR"
    assert len(await recognition_factory.jobs_of_file(ref.file_id)) == 1, "permanent"


# --- point 2: NEEDS_CHECK is never re-sent ----------------------------------------------------


@pytest.mark.parametrize(
    ("status", "fields"),
    [("needs_check", INVOICE), ("done", {"total": INVOICE["total"]})],
    ids=["the service said so", "a required field is missing"],
)
async def test_a_file_that_needs_a_check_waits_for_a_person_with_one_job_and_one_document(
    db_sessions, recognition_factory, recognition_settings, store, waiting, status, fields
):
    ref = await waiting()
    ref_s3 = await _document(store, ref, fields)
    await _apply(db_sessions, _message(ref, _answer(ref, status, result_s3=ref_s3)))

    outcome = await _map(db_sessions, store, recognition_settings, ref.job_id)

    assert (outcome.file_status, outcome.replayed) == ("NEEDS_CHECK", None)
    assert len(await recognition_factory.jobs_of_file(ref.file_id)) == 1
    assert len(await recognition_factory.rows("SELECT id FROM document")) == 1


# --- point 3: error classes -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        ({"code": "UNSUPPORTED_TYPE"}, False),
        ({"code": "UNREADABLE", "message": "not a CSV file"}, False),
        ({"code": "INTERNAL_ERROR"}, True),
        ({"code": "OCR_FAILED"}, True),  # not listed: retryable
        ({"code": "INTERNAL_ERROR", "permanent": True}, False),  # the service's mark wins
        ({"code": "NOT_FOUND", "permanent": False}, True),
    ],
)
async def test_permanent_errors_are_never_retried_retryable_ones_once(
    db_sessions, recognition_factory, recognition_settings, store, waiting, error, retried
):
    ref = await waiting()
    await _apply(db_sessions, _message(ref, _answer(ref, "error", error=error)))

    outcome = await _map(db_sessions, store, recognition_settings, ref.job_id)

    assert (outcome.replayed is not None) is retried
    assert outcome.file_status == ("UPLOADED" if retried else "ERROR")
    job = await recognition_factory.job(ref.job_id)
    assert job["metrics"]["error_class"] == ("retryable" if retried else "permanent")


async def test_a_result_document_off_the_contract_is_permanent(
    db_sessions, recognition_factory, recognition_settings, store, waiting
):
    ref = await waiting()
    ref_s3 = await _document(store, ref, {"total": {"value": 1}})  # no confidence
    await _apply(db_sessions, _message(ref, _answer(ref, result_s3=ref_s3)))

    outcome = await _map(db_sessions, store, recognition_settings, ref.job_id)

    assert (outcome.file_status, outcome.replayed) == ("ERROR", None)
    assert (await recognition_factory.job(ref.job_id))["error_code"] == "INVALID_RESULT"


async def test_a_timeout_is_retried_while_attempts_remain(db_sessions, recognition_factory):
    ref = await recognition_factory.create_job(
        status="processing", reply_deadline=T0 - timedelta(seconds=1)
    )

    outcome = await expire_recognition_deadlines(db_sessions, now=T0, automatic_attempts=2)

    assert [r.old_job_id for r in outcome.replayed] == [ref.job_id]
    assert (await recognition_factory.file(ref.file_id))["status"] == "UPLOADED"


# --- point 7: no Nats-Msg-Id, a result before its ack ------------------------------------------


async def test_an_answer_without_a_msg_id_is_accepted_under_the_id_it_should_carry(
    db_sessions, recognition_factory, waiting, mailroom_logs
):
    ref = await waiting()

    [outcome] = await _apply(
        db_sessions, _message(ref, _answer(ref, "error", error={"code": "EMPTY"}), msg_id=False)
    )

    assert outcome.applied == "result_applied"
    job = await recognition_factory.job(ref.job_id)
    assert job["result_msg_id"] == f"{ref.job_id}:1:result"
    assert any("no Nats-Msg-Id" in m for m in mailroom_logs.messages(logging.WARNING))


async def test_a_result_before_its_ack_is_applied_and_the_late_ack_changes_nothing(
    db_sessions, recognition_factory, store, waiting
):
    ref = await recognition_factory.create_job(
        status="published", reply_deadline=T0 + timedelta(minutes=5)
    )
    ref_s3 = await _document(store, ref, INVOICE)

    outcomes = await _apply(
        db_sessions,
        _message(ref, _answer(ref, result_s3=ref_s3)),
        _message(ref, _answer(ref, "processing"), kind="ack"),
    )

    assert [o.applied for o in outcomes] == ["result_applied", "ack_after_result"]
    assert (await recognition_factory.job(ref.job_id))["status"] == "done"


# --- versioning: the previous version ----------------------------------------------------------


async def test_an_answer_of_the_previous_contract_version_still_works(
    db_sessions, recognition_factory, recognition_settings, store, waiting
):
    # 1.0: no `error.permanent`; the code's class decides, as the rule book says.
    first, second = await waiting(), await waiting()
    await _apply(
        db_sessions,
        _message(first, _answer(first, "error", schema_version="1.0", error={"code": "EMPTY"})),
        _message(second, _answer(second, "error", schema_version=None, error={"code": "X"})),
    )

    assert (await _map(db_sessions, store, recognition_settings, first.job_id)).replayed is None
    assert (await _map(db_sessions, store, recognition_settings, second.job_id)).replayed


async def test_an_answer_of_a_major_mailroom_does_not_read_breaks_the_contract(
    db_sessions, recognition_factory, waiting
):
    ref = await waiting()

    answer = _answer(ref, "error", schema_version="2.0", error={"code": "EMPTY"})
    [outcome] = await _apply(db_sessions, _message(ref, answer))

    assert outcome.applied == "contract_violation"
    assert (await recognition_factory.job(ref.job_id))["error_code"] == "INVALID_RESULT"
