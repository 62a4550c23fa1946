"""Review on the real Postgres: files settled by the real inbox and mapping, then accepted,
corrected or re-run, with the manual attempt, the audit trail and the new notification."""

from __future__ import annotations

import json

import pytest

from mailroom.adapters.storage import build_store
from mailroom.db.clock import db_now
from mailroom.db.engine import transaction
from mailroom.document_types import DocumentType
from mailroom.errors import ReviewConflict, ReviewRefused
from mailroom.notifications.passes import create_notifications
from mailroom.recognition.inbox.apply import apply_recognition_message
from mailroom.recognition.mapping.run import map_recognition_result
from mailroom.recognition.review.actions import accept_file, correct_file, rerun_file
from mailroom.recognition.review.queries import list_review_items, show_review_file
from mailroom.settings import NotificationRoute
from tests.fixtures.recognition import make_settings

pytestmark = pytest.mark.integration

FUND = {"fund": DocumentType(required=[["investor_name", "customer_id"], "amount"])}
ROUTES = [NotificationRoute()]


@pytest.fixture
def settings(database_url, tmp_path):
    # One automatic attempt: a failed check settles at once, so each test states one answer.
    return make_settings(
        database_url=database_url,
        tmp_path=tmp_path,
        automatic_attempts=1,
        document_types={**FUND, "invoice": DocumentType(required=["invoice_number"])},
    )


@pytest.fixture
def recognition_settings(settings):
    """The shared session and factory fixtures use this test's settings."""
    return settings


async def settle(sessions, store, settings, ref, *, status="done", fields=None, error=None):
    """Answer ``ref``'s job through the real inbox, then map it."""
    message = {
        "schema_version": "1.0",
        "job_id": str(ref.job_id),
        "file_id": ref.file_id,
        "status": status,
        "service": {"name": "reader", "version": "1"},
    }
    if fields is not None:
        key = f"results/{ref.job_id}.json"
        result = {"schema_version": "1.0", "job_id": str(ref.job_id), **fields}
        await store.put("results", key, json.dumps(result).encode(), media_type="application/json")
        message["result_s3"] = {"bucket": store.bucket("results"), "key": key}
    if error is not None:
        message["error"] = error
    applied = await apply_recognition_message(
        sessions,
        subject="files.tabular_parsed",
        data=json.dumps(message).encode(),
        headers={"Nats-Msg-Id": f"{ref.job_id}:1:result"},
        max_bytes=100_000,
    )
    assert applied.applied == "result_applied"
    return await map_recognition_result(sessions, store, ref.job_id, settings=settings.recognition)


def fund(**values):
    return {
        "document_type": "fund",
        "fields": {name: {"value": v, "confidence": c} for name, (v, c) in values.items()},
    }


async def notify(sessions):
    async with transaction(sessions) as session:
        batch = await create_notifications(session, routes=ROUTES, now=await db_now(session))
    return batch.message_ids


@pytest.fixture
async def needs_check(db_sessions, recognition_factory, settings):
    """A fund document without investor name or customer id, mapped, its mail notified once."""
    ref = await recognition_factory.create_job(status="processing", original_name="fund.csv")
    outcome = await settle(
        db_sessions, build_store(settings), settings, ref, fields=fund(amount=(500, 0.99))
    )
    assert outcome.file_status == "NEEDS_CHECK"
    assert len(await notify(db_sessions)) == 1
    return ref


async def test_mapping_reports_an_unmet_one_of_rule_and_review_lists_and_shows_it(
    db_sessions, settings, needs_check
):
    async with db_sessions() as session:
        [item] = await list_review_items(session, limit=10)
        shown = await show_review_file(session, needs_check.file_id, settings=settings.recognition)

    assert (item.file_id, item.status, item.mailbox) == (needs_check.file_id, "NEEDS_CHECK", "test")
    assert item.document.missing == ["investor_name|customer_id"]
    assert shown.required == ["investor_name|customer_id", "amount"]
    assert shown.item.document.field_confidence == {"amount": 0.99}
    assert shown.bucket == "mailroom-incoming" and shown.key.startswith("files/")
    assert [(a.attempt, a.kind, a.status, a.current) for a in shown.attempts] == [
        (1, "automatic", "done", True)
    ]


async def test_correct_is_a_manual_attempt_audited_and_notified_again(
    db_sessions, recognition_factory, settings, needs_check
):
    mail_before = await recognition_factory.mail(needs_check.mail_id)

    async with transaction(db_sessions) as session:
        outcome = await correct_file(
            session,
            needs_check.file_id,
            {"customer_id": "C-9"},
            operator="alice",
            settings=settings.recognition,
        )

    assert (outcome.action, outcome.attempt, outcome.file_status) == ("corrected", 2, "RECOGNIZED")
    assert outcome.finalized_mail_ids == [needs_check.mail_id]
    [auto, manual] = await recognition_factory.jobs_of_file(needs_check.file_id)
    assert (auto["kind"], auto["operator_id"]) == ("automatic", None)
    assert (manual["kind"], manual["operator_id"], manual["status"]) == ("manual", "alice", "done")
    assert manual["finished_at"] is not None and manual["mapped_at"] is not None
    file = await recognition_factory.file(needs_check.file_id)
    assert (file["status"], file["current_recognition_job_id"]) == ("RECOGNIZED", manual["id"])
    assert file["status_reason"] == "corrected by alice: customer_id"
    [doc] = await recognition_factory.rows(
        "SELECT * FROM document WHERE job_id = :id", {"id": manual["id"]}
    )
    assert doc["fields"] == {"amount": 500, "customer_id": "C-9"}
    assert doc["field_confidence"] == {"amount": 0.99, "customer_id": 1.0}
    assert (doc["missing_fields"], doc["status"]) == ([], "ok")
    [event] = await recognition_factory.rows(
        "SELECT * FROM audit_event WHERE action = 'review.corrected'"
    )
    assert (event["actor_type"], event["actor_id"]) == ("operator", "alice")
    assert event["target"] == f"stored_file:{needs_check.file_id}"
    assert event["detail"]["changes"] == {"customer_id": {"from": None, "to": "C-9"}}
    assert event["detail"]["previous_job_id"] == str(needs_check.job_id)

    # The mail is final again, with a new final state: a second notification, not a duplicate.
    mail = await recognition_factory.mail(needs_check.mail_id)
    assert mail["status"] == "final" and mail["finalized_at"] > mail_before["finalized_at"]
    [message_id] = await notify(db_sessions)
    [message] = await recognition_factory.rows(
        "SELECT * FROM channel_message WHERE id = :id", {"id": message_id}
    )
    assert "fund.csv: RECOGNIZED as fund" in message["body"]
    assert "customer_id=C-9" in message["body"]
    assert len(await recognition_factory.rows("SELECT id FROM channel_message")) == 2


async def test_corrected_values_are_stored_with_their_field_types_or_refused(
    db_sessions, recognition_factory, settings, needs_check
):
    types = settings.recognition.document_types
    types["fund"] = types["fund"].model_copy(update={"field_types": {"due": "date"}})
    async with transaction(db_sessions) as session:
        with pytest.raises(ReviewRefused, match="field 'amount' takes an integer"):
            await correct_file(
                session,
                needs_check.file_id,
                {"amount": "lots", "customer_id": "C-9"},
                operator="alice",
                settings=settings.recognition,
            )
    assert len(await recognition_factory.jobs_of_file(needs_check.file_id)) == 1, "nothing stored"

    async with transaction(db_sessions) as session:
        await correct_file(
            session,
            needs_check.file_id,
            {"amount": "510", "customer_id": "9", "due": "2030-01-31"},
            operator="alice",
            settings=settings.recognition,
        )
    [doc] = await recognition_factory.rows("SELECT fields FROM document ORDER BY id DESC LIMIT 1")
    # amount was a number (500): it stays one; customer_id is new text; due is declared a date.
    assert doc["fields"] == {"amount": 510, "customer_id": "9", "due": "2030-01-31"}


async def test_accept_keeps_the_document_and_records_the_operator(
    db_sessions, recognition_factory, settings, needs_check
):
    async with transaction(db_sessions) as session:
        outcome = await accept_file(
            session, needs_check.file_id, operator="bob", settings=settings.recognition
        )

    [doc] = await recognition_factory.rows(
        "SELECT * FROM document WHERE id = :id", {"id": outcome.document_id}
    )
    # Accepted as is: the gap stays visible on the document an operator let through.
    assert (doc["fields"], doc["missing_fields"]) == (
        {"amount": 500},
        ["investor_name|customer_id"],
    )
    assert (await recognition_factory.file(needs_check.file_id))["status"] == "RECOGNIZED"
    [event] = await recognition_factory.rows("SELECT * FROM audit_event")
    assert (event["action"], event["actor_id"], event["detail"]["changes"]) == (
        "review.accepted",
        "bob",
        {},
    )
    assert len(await notify(db_sessions)) == 1
    async with db_sessions() as session:
        assert await list_review_items(session, limit=10) == []


async def test_rerun_queues_a_new_automatic_attempt_and_reopens_the_mail(
    db_sessions, recognition_factory, settings
):
    ref = await recognition_factory.create_job(status="processing")
    error = {"code": "PARSE_FAILED", "message": "bad header"}
    outcome = await settle(
        db_sessions, build_store(settings), settings, ref, status="error", error=error
    )
    assert outcome.file_status == "ERROR"
    async with db_sessions() as session:
        [item] = await list_review_items(session, limit=10, statuses=("ERROR",))
    assert (item.error_code, item.document) == ("PARSE_FAILED", None)

    async with transaction(db_sessions) as session:
        replayed = await rerun_file(session, ref.file_id, operator="carol", reason="new parser")

    new = await recognition_factory.job(replayed.new_job_id)
    assert (new["status"], new["attempt"], new["kind"]) == ("queued", 2, "automatic")
    file = await recognition_factory.file(ref.file_id)
    assert (file["status"], file["current_recognition_job_id"]) == ("UPLOADED", new["id"])
    assert (await recognition_factory.mail(ref.mail_id))["status"] == "stored"
    [event] = await recognition_factory.rows("SELECT * FROM audit_event")
    assert (event["action"], event["actor_type"], event["actor_id"]) == (
        "recognition.replayed",
        "operator",
        "carol",
    )
    assert event["detail"]["reason"] == "review rerun: new parser"


async def test_accept_without_a_document_a_recognized_file_and_a_waiting_job_are_refused(
    db_sessions, recognition_factory, settings
):
    failed = await recognition_factory.create_job(status="error", file_status="ERROR")
    done = await recognition_factory.create_job(status="done", file_status="RECOGNIZED")
    for file_id, match in ((failed.file_id, "no document to accept"), (done.file_id, "RECOGNIZED")):
        with pytest.raises(ReviewRefused, match=match):
            async with transaction(db_sessions) as session:
                await accept_file(session, file_id, operator="x", settings=settings.recognition)
    waiting = await recognition_factory.create_job(status="published", file_status="ERROR")
    with pytest.raises(ReviewRefused, match="is published; only"):
        async with transaction(db_sessions) as session:
            await rerun_file(session, waiting.file_id, operator="x")
    with pytest.raises(ReviewRefused, match="give its type with --type"):
        async with transaction(db_sessions) as session:
            await correct_file(
                session,
                failed.file_id,
                {"amount": "1"},
                operator="x",
                settings=settings.recognition,
            )


async def test_second_operator_at_once_gets_a_conflict_not_a_lost_update(
    db_sessions, recognition_factory, settings, needs_check
):
    file_id = needs_check.file_id
    # Alice's correction holds the file row (her transaction is still open) ...
    async with transaction(db_sessions) as alice:
        await correct_file(
            alice, file_id, {"customer_id": "A-1"}, operator="alice", settings=settings.recognition
        )
        # ... when Bob acts on the same file from another session: he is told at once.
        with pytest.raises(ReviewConflict, match="being changed right now"):
            async with transaction(db_sessions) as bob:
                await correct_file(
                    bob,
                    file_id,
                    {"customer_id": "B-2"},
                    operator="bob",
                    settings=settings.recognition,
                )

    # Acting later on what he saw before, Bob learns who reviewed it; nothing is overwritten.
    with pytest.raises(ReviewRefused, match="reviewed meanwhile by alice"):
        async with transaction(db_sessions) as bob:
            await accept_file(bob, file_id, operator="bob", settings=settings.recognition)
    manual = await recognition_factory.rows(
        "SELECT operator_id FROM recognition_job WHERE kind = 'manual'"
    )
    assert manual == [{"operator_id": "alice"}]
    [doc] = await recognition_factory.rows(
        "SELECT d.fields FROM document AS d JOIN stored_file AS f "
        "ON f.current_recognition_job_id = d.job_id"
    )
    assert doc["fields"]["customer_id"] == "A-1"


async def test_erase_removes_a_corrections_values_from_its_audit_row_and_keeps_who_and_when(
    db_sessions, recognition_factory, settings, needs_check
):
    from mailroom.lifecycle.erase import erase_mail

    async with transaction(db_sessions) as session:
        await correct_file(
            session,
            needs_check.file_id,
            {"customer_id": "C-SECRET-9"},
            operator="alice",
            settings=settings.recognition,
        )
    query = "SELECT * FROM audit_event WHERE action = 'review.corrected'"
    [before] = await recognition_factory.rows(query)
    assert "C-SECRET-9" in json.dumps(before["detail"]), "the row quotes the value until erased"

    report = await erase_mail(
        db_sessions, build_store(settings), needs_check.mail_id, operator="dpo"
    )

    assert report.erased and report.audit_rows_scrubbed == 1
    [after] = await recognition_factory.rows(query)
    assert "C-SECRET-9" not in json.dumps(after["detail"])
    assert after["detail"]["changed_fields"] == ["customer_id"]
    assert after["detail"]["previous_job_id"] == str(needs_check.job_id)
    assert after["detail"]["scrubbed"] == "content removed by erasure"
    kept = ("id", "actor_type", "actor_id", "action", "target", "created_at")
    assert {k: after[k] for k in kept} == {k: before[k] for k in kept}
    [erase] = await recognition_factory.rows(
        "SELECT * FROM audit_event WHERE action = 'intake.erase'"
    )
    assert erase["detail"]["audit_rows_scrubbed"] == 1 and "scrubbed" not in erase["detail"]
