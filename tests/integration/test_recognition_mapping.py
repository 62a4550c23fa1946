"""Mapping results into documents, automatic retries, mail finality, the unmapped sweep."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from prometheus_client import REGISTRY

from mailroom.adapters.storage import build_store
from mailroom.recognition.inbox.apply import apply_recognition_message
from mailroom.recognition.mapping.run import find_unmapped_results, map_recognition_result
from mailroom.recognition.watchdog import expire_recognition_deadlines
from tests.fixtures.recognition import at

pytestmark = pytest.mark.integration

T0 = at("12:00:00")

INVOICE = {
    "invoice_number": {"value": "INV-7", "confidence": 0.99},
    "total": {"value": 120.5, "confidence": 0.95},
}


@pytest.fixture
def store(recognition_settings):
    return build_store(recognition_settings)


class Flow:
    """Drives one job through the real inbox and mapping."""

    def __init__(self, sessions, factory, store, settings):
        self.sessions, self.factory, self.store, self.settings = sessions, factory, store, settings

    async def answer(
        self, ref, *, status="done", result=None, raw=None, error=None, attempt=1, bucket=None
    ):
        message = {
            "schema_version": "1.0",
            "job_id": str(ref.job_id),
            "file_id": ref.file_id,
            "status": status,
            "service": {"name": "reader", "version": "1"},
        }
        if status in ("done", "needs_check"):
            key = f"results/{ref.job_id}.json"
            if raw is not None or result is not None:
                data = (
                    raw
                    if raw is not None
                    else json.dumps(
                        {"schema_version": "1.0", "job_id": str(ref.job_id), **result}
                    ).encode()
                )
                await self.store.put("results", key, data, media_type="application/json")
            message["result_s3"] = {"bucket": bucket or self.store.bucket("results"), "key": key}
        if error is not None:
            message["error"] = error
        outcome = await apply_recognition_message(
            self.sessions,
            subject="files.tabular_parsed",
            data=json.dumps(message).encode(),
            headers={"Nats-Msg-Id": f"{ref.job_id}:{attempt}:result"},
            max_bytes=100_000,
            now=T0,
        )
        assert outcome.applied == "result_applied"

    async def map(self, job_id, now=T0):
        return await map_recognition_result(
            self.sessions, self.store, job_id, settings=self.settings.recognition, now=now
        )


@pytest.fixture
def flow(db_sessions, recognition_factory, store, recognition_settings):
    return Flow(db_sessions, recognition_factory, store, recognition_settings)


def invoice(**fields):
    return {"document_type": "invoice", "fields": {**INVOICE, **fields}}


async def test_good_result_becomes_a_document_and_the_mail_is_final(flow, recognition_factory):
    ref = await recognition_factory.create_job(status="processing")

    await flow.answer(ref, result=invoice())
    outcome = await flow.map(ref.job_id)

    assert (outcome.applied, outcome.file_status) == ("mapped", "RECOGNIZED")
    [doc] = await recognition_factory.rows("SELECT * FROM document")
    assert doc["id"] == outcome.document_id
    assert (doc["document_type"], doc["status"]) == ("invoice", "ok")
    assert doc["fields"] == {"invoice_number": "INV-7", "total": 120.5}
    assert doc["field_confidence"] == {"invoice_number": 0.99, "total": 0.95}
    assert (doc["missing_fields"], doc["low_confidence_fields"]) == ([], [])
    assert (await recognition_factory.job(ref.job_id))["mapped_at"] == T0
    assert (await recognition_factory.file(ref.file_id))["status"] == "RECOGNIZED"
    assert outcome.finalized_mail_id == ref.mail_id
    mail = await recognition_factory.mail(ref.mail_id)
    assert (mail["status"], mail["finalized_at"]) == ("final", T0)


async def test_mapping_twice_writes_one_document(flow, recognition_factory):
    ref = await recognition_factory.create_job(status="processing")
    await flow.answer(ref, result=invoice())

    first = await flow.map(ref.job_id)
    second = await flow.map(ref.job_id)

    assert (first.applied, second.applied) == ("mapped", "already_mapped")
    assert len(await recognition_factory.rows("SELECT id FROM document")) == 1


async def test_service_needs_check_settles_without_a_retry(flow, recognition_factory):
    ref = await recognition_factory.create_job(status="processing")
    await flow.answer(ref, status="needs_check", result=invoice())

    outcome = await flow.map(ref.job_id)

    assert (outcome.file_status, outcome.replayed) == ("NEEDS_CHECK", None)
    [doc] = await recognition_factory.rows("SELECT status FROM document")
    assert doc["status"] == "needs_check"


async def test_a_missing_required_field_needs_a_check_at_once_and_is_never_re_sent(
    flow, recognition_factory
):
    ref = await recognition_factory.create_job(status="processing")
    incomplete = {"document_type": "invoice", "fields": {"total": INVOICE["total"]}}

    await flow.answer(ref, result=incomplete)
    outcome = await flow.map(ref.job_id)

    # One job, one document: the file waits for a person, not for another recognition.
    assert (outcome.replayed, outcome.file_status) == (None, "NEEDS_CHECK")
    assert outcome.finalized_mail_id == ref.mail_id
    [doc] = await recognition_factory.rows("SELECT * FROM document")
    assert doc["missing_fields"] == ["invoice_number"]
    jobs = await recognition_factory.jobs_of_file(ref.file_id)
    assert [(j["attempt"], j["status"]) for j in jobs] == [(1, "done")]
    file = await recognition_factory.file(ref.file_id)
    assert "invoice_number" in file["status_reason"]
    assert await recognition_factory.rows("SELECT * FROM audit_event") == []


async def test_a_plain_result_logs_in_its_batch_line_and_a_retry_on_a_line_of_its_own(
    flow, recognition_factory, mailroom_logs
):
    plain = await recognition_factory.create_job(status="processing")
    await flow.answer(plain, result=invoice())
    await flow.map(plain.job_id)
    retried = await recognition_factory.create_job(status="processing")
    await flow.answer(retried, status="error", error={"code": "INTERNAL_ERROR"})
    outcome = await flow.map(retried.job_id)

    mapping = [m for m in mailroom_logs.messages(logging.INFO) if "mapped" in m]
    assert outcome.replayed is not None
    assert mapping == [
        "Mapping batch: 1 result(s) mapped (RECOGNIZED 1), 1 mail(s) final",
        f"Result of job {retried.job_id} mapped: file UPLOADED, "
        f"retried as {outcome.replayed.new_job_id}",
        "Mapping batch: 1 result(s) mapped (retried 1), 0 mail(s) final",
    ]
    assert any(str(plain.job_id) in m for m in mailroom_logs.messages(logging.DEBUG))


async def test_low_confidence_field_counts_as_a_failed_check(flow, recognition_factory):
    ref = await recognition_factory.create_job(status="processing", attempt=2)
    await flow.answer(ref, result=invoice(total={"value": 1, "confidence": 0.3}), attempt=2)

    outcome = await flow.map(ref.job_id)

    assert (outcome.file_status, outcome.replayed) == ("NEEDS_CHECK", None)
    [doc] = await recognition_factory.rows("SELECT * FROM document")
    assert doc["low_confidence_fields"] == ["total"]


async def test_error_result_is_retried_then_the_file_settles_as_error(flow, recognition_factory):
    ref = await recognition_factory.create_job(status="processing")
    await flow.answer(ref, status="error", error={"code": "OCR_FAILED", "message": "blurry"})

    first = await flow.map(ref.job_id)
    assert first.replayed is not None and first.replayed.attempt == 2
    retry = type(ref)(first.replayed.new_job_id, ref.file_id, ref.mail_id, None)
    await recognition_factory.set_job(retry.job_id, status="processing")
    await flow.answer(retry, status="error", error={"code": "OCR_FAILED"}, attempt=2)
    second = await flow.map(retry.job_id)

    assert (second.replayed, second.file_status) == (None, "ERROR")
    assert second.finalized_mail_id == ref.mail_id
    assert await recognition_factory.rows("SELECT id FROM document") == []


@pytest.mark.parametrize("raw", [None, b"not json", b'{"schema_version": "1.0"}'])
async def test_unusable_result_file_counts_as_a_failed_attempt(
    flow, recognition_factory, recognition_settings, raw, caplog
):
    ref = await recognition_factory.create_job(status="processing", attempt=2)
    await flow.answer(ref, raw=raw, attempt=2)
    violations = _violations("invalid_result")

    outcome = await flow.map(ref.job_id)

    assert outcome.file_status == "ERROR"
    job = await recognition_factory.job(ref.job_id)
    assert (job["status"], job["error_code"]) == ("error", "INVALID_RESULT")
    assert "INVALID_RESULT" in (await recognition_factory.file(ref.file_id))["status_reason"]
    # Loud: one WARNING line (without the document) and the counter.
    warnings = [r for r in caplog.records if "broke the contract" in r.getMessage()]
    assert [r.levelname for r in warnings] == ["WARNING"]
    assert "not json" not in warnings[0].getMessage()
    assert _violations("invalid_result") == violations + 1


def _violations(reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "mailroom_recognition_contract_violations_total",
        {"service": "reader", "reason": reason},
    )
    return value or 0.0


async def test_result_of_an_old_attempt_is_mapped_without_touching_the_file(
    flow, recognition_factory
):
    old = await recognition_factory.create_job(status="processing", current=False)
    await recognition_factory.create_job(file_id=old.file_id, attempt=2)
    await flow.answer(old, result=invoice())

    outcome = await flow.map(old.job_id)

    assert outcome.file_status is None and outcome.document_id is not None
    assert (await recognition_factory.file(old.file_id))["status"] == "UPLOADED"


async def test_mail_is_final_only_when_every_file_is_and_timeouts_count(
    flow, db_sessions, recognition_factory
):
    mail_id = await recognition_factory.create_mail()
    good = await recognition_factory.create_job(mail_id=mail_id, status="processing")
    slow = await recognition_factory.create_job(
        mail_id=mail_id, status="processing", reply_deadline=T0 + timedelta(seconds=30)
    )
    await recognition_factory.create_job(mail_id=mail_id, file_status="SKIPPED", current=False)

    await flow.answer(good, result=invoice())
    mapped = await flow.map(good.job_id)
    assert mapped.finalized_mail_id is None
    assert (await recognition_factory.mail(mail_id))["status"] == "stored"

    # The last attempt (no retry left): the timeout settles the file.
    watchdog = await expire_recognition_deadlines(
        db_sessions, now=T0 + timedelta(seconds=31), automatic_attempts=1
    )

    assert watchdog.timed_out == [slow.job_id]
    assert watchdog.finalized_mail_ids == [mail_id]
    assert (await recognition_factory.mail(mail_id))["status"] == "final"


async def test_unmapped_results_older_than_the_setting_are_found_by_the_sweep(
    flow, db_sessions, recognition_factory, recognition_settings
):
    stale = await recognition_factory.create_job(status="processing")
    mapped = await recognition_factory.create_job(status="processing")
    for ref in (stale, mapped):
        await flow.answer(ref, result=invoice())
    await flow.map(mapped.job_id)
    invalid = await recognition_factory.create_job(status="error", error_code="INVALID_REQUEST")
    await recognition_factory.set_job(invalid.job_id, finished_at=T0)

    found_early = await find_unmapped_results(
        db_sessions, settings=recognition_settings.recognition, now=T0 + timedelta(seconds=59)
    )
    found = await find_unmapped_results(
        db_sessions, settings=recognition_settings.recognition, now=T0 + timedelta(seconds=61)
    )

    assert found_early == []
    assert found == [stale.job_id], "mapped jobs and errors that never reached a service stay out"


class SpyStore:
    """The real store, recording which objects were read whole."""

    def __init__(self, store):
        self.store, self.gets = store, []

    def bucket(self, role):
        return self.store.bucket(role)

    async def size(self, bucket, key):
        return await self.store.size(bucket, key)

    async def get(self, bucket, key):
        self.gets.append((bucket, key))
        return await self.store.get(bucket, key)


async def test_a_result_in_another_bucket_is_refused_unread(
    flow, recognition_factory, store, recognition_settings
):
    ref = await recognition_factory.create_job(status="processing", attempt=2)
    key = f"results/{ref.job_id}.json"
    data = json.dumps({"schema_version": "1.0", "job_id": str(ref.job_id), **invoice()})
    await store.put("mail", key, data.encode(), media_type="application/json")
    await flow.answer(ref, attempt=2, bucket=store.bucket("mail"))
    spy = SpyStore(store)

    outcome = await map_recognition_result(
        flow.sessions, spy, ref.job_id, settings=recognition_settings.recognition, now=T0
    )

    assert (outcome.file_status, spy.gets) == ("ERROR", [])
    job = await recognition_factory.job(ref.job_id)
    assert job["error_code"] == "RESULT_FOREIGN_BUCKET"
    file = await recognition_factory.file(ref.file_id)
    assert file["status_reason"].startswith("RESULT_FOREIGN_BUCKET:")
    assert await recognition_factory.rows("SELECT id FROM document") == []


async def test_an_oversize_result_is_refused_before_it_is_read(
    flow, recognition_factory, store, recognition_settings
):
    ref = await recognition_factory.create_job(status="processing", attempt=2)
    padding = {"note": {"value": "x" * 5_000, "confidence": 0.99}}
    await flow.answer(ref, result=invoice(**padding), attempt=2)
    spy = SpyStore(store)
    settings = recognition_settings.recognition.model_copy(update={"max_result_bytes": 1_000})

    outcome = await map_recognition_result(
        flow.sessions, spy, ref.job_id, settings=settings, now=T0
    )

    assert (outcome.file_status, spy.gets) == ("ERROR", [])
    job = await recognition_factory.job(ref.job_id)
    assert job["error_code"] == "RESULT_TOO_LARGE" and "bytes" in job["error_message"]
    assert (await recognition_factory.file(ref.file_id))["status_reason"].startswith(
        "RESULT_TOO_LARGE:"
    )
