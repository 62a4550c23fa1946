"""Every result document an answer to a mail's jobs named goes with the mail, whoever wrote it.

On Postgres and the object store, through the real inbox: a forged answer that beat the
recognizer's leaves the genuine document unregistered (a duplicate of the forged one's message
id), a forged answer under another attempt names one more, and an answer for a job erased while
in flight names one the inbox never kept. Erasure deletes what the jobs registered; the inbox
queues each document it did not keep, and the retention pass's deletion step removes them,
never one another job registered.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from mailroom.adapters.storage import build_store
from mailroom.lifecycle.erase import erase_mail
from mailroom.lifecycle.objects import delete_queued_objects
from mailroom.recognition.inbox.apply import apply_recognition_messages
from mailroom.recognition.inbox.messages import InboxMessage
from tests.fixtures.recognition import at

pytestmark = pytest.mark.integration

T0 = at("12:00:00")


@pytest.fixture
def store(recognition_settings):
    return build_store(recognition_settings)


async def _document(store, ref, key: str) -> tuple[str, str]:
    body = {"job_id": str(ref.job_id), "document_type": "invoice", "fields": {}}
    stored = await store.put(
        "results", key, json.dumps(body).encode(), media_type="application/json"
    )
    return stored.bucket, stored.key


async def _answer(sessions, ref, where: tuple[str, str], *, attempt: int = 1) -> str:
    bucket, key = where
    body = {
        "schema_version": "1.0",
        "job_id": str(ref.job_id),
        "file_id": ref.file_id,
        "status": "done",
        "service": {"name": "reader", "version": "1"},
        "result_s3": {"bucket": bucket, "key": key},
    }
    headers = {"Nats-Msg-Id": f"{ref.job_id}:{attempt}:result"}
    message = InboxMessage("files.tabular_parsed", json.dumps(body).encode(), headers)
    [outcome] = await apply_recognition_messages(
        sessions, [message], max_bytes=65536, now=T0, results_bucket=bucket
    )
    return outcome.applied


async def _waiting(factory):
    return await factory.create_job(
        status="processing", published_at=T0, reply_deadline=T0 + timedelta(minutes=5)
    )


async def _exists(store, where: tuple[str, str]) -> bool:
    return await store.exists(*where)


async def test_erasure_leaves_no_result_document_a_forged_or_genuine_answer_named(
    db_sessions, recognition_factory, store
):
    ref = await _waiting(recognition_factory)
    other = await _waiting(recognition_factory)
    forged = await _document(store, ref, "results/forged.json")
    genuine = await _document(store, ref, f"results/{ref.job_id}.1.json")
    forged_again = await _document(store, ref, "results/forged-again.json")
    kept = await _document(store, other, f"results/{other.job_id}.1.json")
    assert await _answer(db_sessions, other, kept) == "result_applied"

    assert await _answer(db_sessions, ref, forged) == "result_applied"
    assert await _answer(db_sessions, ref, genuine) == "result_duplicate"
    assert await _answer(db_sessions, ref, forged_again, attempt=7) == "msg_id_mismatch"
    # Another job's registered document, named by an answer that is not kept: never deleted.
    assert await _answer(db_sessions, ref, kept) == "result_duplicate"

    report = await erase_mail(db_sessions, store, ref.mail_id, operator="dpo")
    assert report.erased and report.deletion.deleted >= 1
    # The retention pass's deletion step (``deletion_grace_s`` after the answers).
    await delete_queued_objects(db_sessions, store, grace_s=0)

    for where in (forged, genuine, forged_again):
        assert not await _exists(store, where), where
    assert await _exists(store, kept), "the other job's registered result stays"


async def test_an_answer_for_a_job_erased_in_flight_leaves_no_document(
    db_sessions, recognition_factory, store
):
    ref = await _waiting(recognition_factory)
    await erase_mail(db_sessions, store, ref.mail_id, operator="dpo")
    late = await _document(store, ref, f"results/{ref.job_id}.1.json")

    assert await _answer(db_sessions, ref, late) == "unknown_job"
    await delete_queued_objects(db_sessions, store, grace_s=0)

    assert not await _exists(store, late)
