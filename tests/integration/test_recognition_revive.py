"""An answer wins over a NO_ACK dead letter (revive.py), against real Postgres.

The jobs are dead-lettered by the real outbox (no ack within the window), then
the answer the bridge held back arrives through the real inbox, and mapping and
notification creation follow the new final state.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from mailroom.adapters.nats import InMemoryPublisher
from mailroom.adapters.storage import build_store
from mailroom.notifications.passes import create_notifications
from mailroom.recognition.inbox.apply import InboxMessage, apply_recognition_messages
from mailroom.recognition.mapping.run import map_recognition_result
from mailroom.recognition.outbox.relay import publish_recognition_requests
from mailroom.recognition.replay import replay_job
from mailroom.recognition.watchdog import expire_recognition_deadlines
from mailroom.settings import NotificationRoute
from tests.fixtures.recognition import at

pytestmark = pytest.mark.integration

T0 = at("12:00:00")
#: Past the default no-ack window (30 s x 4), well before the reply deadline (300 s).
DEAD = T0 + timedelta(seconds=200)
LATER = T0 + timedelta(seconds=210)
INVOICE = {
    "document_type": "invoice",
    "fields": {
        "invoice_number": {"value": "INV-7", "confidence": 0.99},
        "total": {"value": 120.5, "confidence": 0.95},
    },
}


@pytest.fixture
def store(recognition_settings):
    return build_store(recognition_settings)


async def dead_letter(sessions, settings, factory, ref):
    """Publish ``ref`` and let the outbox run out of republishes without an ack."""
    publisher = InMemoryPublisher()
    run = {"nats": settings.nats, "recognition": settings.recognition}
    await publish_recognition_requests(sessions, publisher, now=T0, **run)
    for n in range(1, 5):
        now = T0 + timedelta(seconds=30 * n + 1)
        await publish_recognition_requests(sessions, publisher, now=now, **run)
    job = await factory.job(ref.job_id)
    assert (job["status"], job["error_code"]) == ("dlq", "NO_ACK")
    assert (await factory.file(ref.file_id))["status"] == "ERROR"


def answer(ref, status, store=None, **extra):
    message = {
        "schema_version": "1.0",
        "job_id": str(ref.job_id),
        "file_id": ref.file_id,
        "status": status,
        "service": {"name": "reader", "version": "1"},
        **extra,
    }
    kind = "ack" if status == "processing" else "result"
    if status in ("done", "needs_check"):
        message["result_s3"] = {"bucket": store.bucket("results"), "key": f"r/{ref.job_id}.json"}
        message["result_schema_version"] = "1.0"
    return InboxMessage(
        "files.tabular_parsed",
        json.dumps(message).encode(),
        {"Nats-Msg-Id": f"{ref.job_id}:1:{kind}"},
    )


async def deliver(sessions, *messages, now=LATER):
    return await apply_recognition_messages(sessions, list(messages), max_bytes=100_000, now=now)


async def put_result(store, ref):
    data = json.dumps({"schema_version": "1.0", "job_id": str(ref.job_id), **INVOICE}).encode()
    await store.put("results", f"r/{ref.job_id}.json", data, media_type="application/json")


async def notify(sessions, now):
    async with sessions() as session, session.begin():
        batch = await create_notifications(session, routes=[NotificationRoute()], now=now)
    return batch.message_ids


async def test_held_back_ack_and_result_revive_the_job_its_file_and_its_mail(
    db_sessions, recognition_factory, recognition_settings, store, mailroom_logs
):
    ref = await recognition_factory.create_job()
    await dead_letter(db_sessions, recognition_settings, recognition_factory, ref)
    first = await notify(db_sessions, DEAD)
    assert len(first) == 1, "the dead letter made the mail final and it was notified"

    outcomes = await deliver(db_sessions, answer(ref, "processing"), answer(ref, "done", store))

    assert [o.applied for o in outcomes] == ["ack_applied", "result_applied"]
    assert outcomes[1].map_job_id == ref.job_id
    job = await recognition_factory.job(ref.job_id)
    assert (job["status"], job["error_code"], job["error_message"]) == ("done", None, None)
    assert (job["started_at"], job["finished_at"]) == (LATER, LATER)
    assert job["result_msg_id"] == f"{ref.job_id}:1:result"
    assert job["metrics"]["revived"]["code"] == "NO_ACK"
    assert job["metrics"]["republish_count"] == 3
    file = await recognition_factory.file(ref.file_id)
    assert (file["status"], file["status_reason"]) == ("PROCESSING", None)
    mail = await recognition_factory.mail(ref.mail_id)
    assert (mail["status"], mail["finalized_at"], mail["notified_at"]) == ("stored", None, None)
    assert any("revived" in m for m in mailroom_logs.messages())

    # Mapping settles the file and finalizes the mail again; it is notified under its new state.
    await put_result(store, ref)
    mapped = await map_recognition_result(
        db_sessions, store, ref.job_id, settings=recognition_settings.recognition, now=LATER
    )
    assert (mapped.file_status, mapped.finalized_mail_id) == ("RECOGNIZED", ref.mail_id)
    second = await notify(db_sessions, LATER)
    assert len(second) == 1 and second != first
    [body] = await recognition_factory.rows(
        "SELECT body FROM channel_message WHERE id = :id", {"id": second[0]}
    )
    assert "RECOGNIZED" in body["body"]


async def test_a_result_without_its_ack_revives_too_and_a_duplicate_changes_nothing(
    db_sessions, recognition_factory, recognition_settings, store
):
    ref = await recognition_factory.create_job()
    await dead_letter(db_sessions, recognition_settings, recognition_factory, ref)

    [applied] = await deliver(db_sessions, answer(ref, "done", store))
    before = await recognition_factory.job(ref.job_id)
    [again] = await deliver(db_sessions, answer(ref, "done", store), now=LATER + timedelta(1))

    assert (applied.applied, again.applied) == ("result_applied", "result_duplicate")
    assert before["status"] == "done" and before["started_at"] is None
    assert await recognition_factory.job(ref.job_id) == before
    assert (await recognition_factory.file(ref.file_id))["status"] == "PROCESSING"


async def test_an_error_result_revives_with_its_own_reason(
    db_sessions, recognition_factory, recognition_settings
):
    ref = await recognition_factory.create_job()
    await dead_letter(db_sessions, recognition_settings, recognition_factory, ref)

    error = {"code": "UNREADABLE", "message": "blank page"}
    [outcome] = await deliver(db_sessions, answer(ref, "error", error=error))

    assert outcome.map_job_id == ref.job_id
    job = await recognition_factory.job(ref.job_id)
    assert (job["status"], job["error_code"]) == ("error", "UNREADABLE")
    file = await recognition_factory.file(ref.file_id)
    assert (file["status"], file["status_reason"]) == ("ERROR", "UNREADABLE: blank page")
    assert (await recognition_factory.mail(ref.mail_id))["status"] == "stored"


async def test_an_ack_alone_revives_and_the_watchdog_still_bounds_the_job(
    db_sessions, recognition_factory, recognition_settings
):
    ref = await recognition_factory.create_job()
    await dead_letter(db_sessions, recognition_settings, recognition_factory, ref)

    [outcome] = await deliver(db_sessions, answer(ref, "processing"))

    assert outcome.applied == "ack_applied"
    job = await recognition_factory.job(ref.job_id)
    assert (job["status"], job["finished_at"], job["error_code"]) == ("processing", None, None)
    assert (await recognition_factory.file(ref.file_id))["status"] == "PROCESSING"
    assert (await recognition_factory.mail(ref.mail_id))["status"] == "stored"

    # No result ever comes: past the reply deadline the watchdog ends it as for any acked job
    # (on its last attempt: no retry).
    await expire_recognition_deadlines(
        db_sessions, now=T0 + timedelta(seconds=301), automatic_attempts=1
    )
    assert (await recognition_factory.job(ref.job_id))["status"] == "timeout"
    assert (await recognition_factory.mail(ref.mail_id))["status"] == "final"


async def test_an_ack_past_the_reply_deadline_does_not_revive_but_its_result_does(
    db_sessions, recognition_factory, recognition_settings, store
):
    ref = await recognition_factory.create_job()
    await dead_letter(db_sessions, recognition_settings, recognition_factory, ref)
    past = T0 + timedelta(seconds=301)

    [ack] = await deliver(db_sessions, answer(ref, "processing"), now=past)
    assert ack.applied == "ack_unexpected"
    assert (await recognition_factory.job(ref.job_id))["status"] == "dlq"

    # A watchdog run between the ack and the result finds nothing to time out.
    assert (await expire_recognition_deadlines(db_sessions, now=past)).timed_out == []
    [result] = await deliver(db_sessions, answer(ref, "done", store), now=past)
    assert result.applied == "result_applied"
    assert (await recognition_factory.job(ref.job_id))["status"] == "done"


async def test_a_late_answer_to_a_replayed_dead_letter_changes_the_old_row_only(
    db_sessions, recognition_factory, recognition_settings, store
):
    ref = await recognition_factory.create_job()
    await dead_letter(db_sessions, recognition_settings, recognition_factory, ref)
    async with db_sessions() as session, session.begin():
        new = await replay_job(session, ref.job_id, actor_type="operator", actor_id="t", now=DEAD)
    # The new attempt has settled and the mail is final (and notified) again.
    await recognition_factory.set_job(new.new_job_id, status="done")
    await recognition_factory._execute(
        "UPDATE stored_file SET status = 'RECOGNIZED' WHERE id = :id", {"id": ref.file_id}
    )
    await recognition_factory._execute(
        "UPDATE inbound_mail SET status = 'final', finalized_at = :t, notified_at = :t "
        "WHERE id = :id",
        {"id": ref.mail_id, "t": DEAD},
    )

    outcomes = await deliver(db_sessions, answer(ref, "processing"), answer(ref, "done", store))

    assert [o.applied for o in outcomes] == ["ack_applied", "result_applied"]
    assert (await recognition_factory.job(ref.job_id))["status"] == "done"
    file = await recognition_factory.file(ref.file_id)
    assert (file["status"], file["current_recognition_job_id"]) == ("RECOGNIZED", new.new_job_id)
    mail = await recognition_factory.mail(ref.mail_id)
    assert (mail["status"], mail["finalized_at"], mail["notified_at"]) == ("final", DEAD, DEAD)


async def test_other_final_statuses_stay_final(db_sessions, recognition_factory, store):
    timed_out = await recognition_factory.create_job(
        status="timeout", error_code="TIMEOUT", file_status="ERROR"
    )
    other_dlq = await recognition_factory.create_job(
        status="dlq", error_code="SOMETHING_ELSE", file_status="ERROR"
    )

    outcomes = await deliver(
        db_sessions,
        answer(timed_out, "processing"),
        answer(timed_out, "done", store),
        answer(other_dlq, "done", store),
    )

    assert [o.applied for o in outcomes] == ["ack_unexpected", "result_late", "result_late"]
    assert (await recognition_factory.job(timed_out.job_id))["status"] == "timeout"
    assert (await recognition_factory.job(other_dlq.job_id))["status"] == "dlq"
