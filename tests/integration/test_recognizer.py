"""The reference recognizer against a real NATS server and a filesystem object store."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from openpyxl import Workbook

from mailroom.recognition.contract.models import (
    RESULT_SCHEMA_VERSION,
    RecognitionResult,
    ack_msg_id,
    result_msg_id,
)
from mailroom.recognizer.faults import RecognizerFaults
from mailroom.recognizer.service import ReferenceRecognizer, service_version
from mailroom.service import result_key
from mailroom.settings import RecognizerSettings

pytestmark = pytest.mark.integration

INVOICE_CSV = b"Invoice Number,Total,Currency\nINV-1,10.50,EUR\n"


def xlsx_bytes(rows: list[list[object]]) -> bytes:
    workbook = Workbook()
    sheet = workbook.active
    assert sheet is not None
    for row in rows:
        sheet.append(row)
    buffer = io.BytesIO()
    workbook.save(buffer)
    return buffer.getvalue()


async def stored_result(client, answer) -> RecognitionResult:
    ref = answer.response.result_s3
    assert ref is not None
    return RecognitionResult.model_validate_json(await client.store.get(ref.bucket, ref.key))


async def test_csv_request_gets_an_ack_then_a_done_result(start_recognizer, recognizer_client):
    recognizer = await start_recognizer()
    request = await recognizer_client.submit(INVOICE_CSV, file_type="csv", file_id=42)

    ack, result = await recognizer_client.ack_and_result()

    assert ack.msg_id == ack_msg_id(request.job_id, 1)
    assert ack.response.job_id == request.job_id
    assert ack.response.file_id == 42
    assert ack.response.service.name == "mailroom-reference-recognizer"
    assert ack.response.service.version == service_version()
    assert result.msg_id == result_msg_id(request.job_id, 1)
    response = result.response
    assert response.status == "done"
    assert response.result_schema_version == RESULT_SCHEMA_VERSION
    assert response.metrics is not None
    assert response.metrics.fields_total == 3
    assert response.metrics.fields_low_confidence == 0
    assert response.metrics.fields_unrecognized == 0
    assert response.error is None
    assert response.result_s3 is not None
    assert response.result_s3.bucket == recognizer_client.store.bucket("results")
    assert response.result_s3.key == result_key(request.job_id, 1)
    document = await stored_result(recognizer_client, result)
    assert document.job_id == request.job_id
    assert document.document_type == "invoice"
    assert {k: f.value for k, f in document.fields.items()} == {
        "invoice_number": "INV-1",
        "total": "10.50",
        "currency": "EUR",
    }
    assert recognizer.extractions == 1


async def test_xlsx_key_value_sheet_is_recognized(start_recognizer, recognizer_client):
    await start_recognizer()
    data = xlsx_bytes([["Vendor", "ACME"], ["Total", 99.5], ["Invoice Number", "X-9"]])
    await recognizer_client.submit(data, file_type="xlsx")

    _, result = await recognizer_client.ack_and_result()

    assert result.response.status == "done"
    document = await stored_result(recognizer_client, result)
    assert document.document_type == "invoice"
    assert {k: f.value for k, f in document.fields.items()} == {
        "vendor": "ACME",
        "total": 99.5,
        "invoice_number": "X-9",
    }


async def test_text_with_a_garbled_value_needs_check(start_recognizer, recognizer_client):
    await start_recognizer()
    await recognizer_client.submit(b"Vendor: ACME\nTotal: #N/A\nNote:\n", file_type="txt")

    _, result = await recognizer_client.ack_and_result()

    assert result.response.status == "needs_check"
    assert result.response.metrics is not None
    assert result.response.metrics.fields_total == 3
    assert result.response.metrics.fields_low_confidence == 2
    assert result.response.metrics.fields_unrecognized == 1
    document = await stored_result(recognizer_client, result)
    assert document.fields["note"].value is None


async def test_image_request_needs_check_with_no_fields(start_recognizer, recognizer_client):
    await start_recognizer()
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01"
    await recognizer_client.submit(png, file_type="png", pipeline="image")

    _, result = await recognizer_client.ack_and_result()

    assert result.response.status == "needs_check"
    assert result.response.metrics is not None
    assert result.response.metrics.fields_total == 0
    assert (await stored_result(recognizer_client, result)).fields == {}


@pytest.mark.parametrize(
    ("data", "file_type", "code"),
    [
        (b"caf\xe9,total\n1,2\n", "csv", "UNREADABLE"),
        (b"not a zip at all", "xlsx", "UNREADABLE"),
        (b"\n\n", "csv", "EMPTY"),
        (b"\xd0\xcf\x11\xe0", "xls", "UNSUPPORTED_TYPE"),
    ],
)
async def test_broken_file_gets_an_error_result(
    start_recognizer, recognizer_client, data, file_type, code
):
    await start_recognizer()
    request = await recognizer_client.submit(data, file_type=file_type)

    _, result = await recognizer_client.ack_and_result()

    assert result.msg_id == result_msg_id(request.job_id, 1)
    assert result.response.status == "error"
    assert result.response.error is not None
    assert result.response.error.code == code
    assert result.response.error.message
    assert result.response.result_s3 is None
    assert not await recognizer_client.store.exists(
        recognizer_client.store.bucket("results"), result_key(request.job_id, 1)
    )


async def test_missing_file_gets_not_found(start_recognizer, recognizer_client):
    await start_recognizer()
    ref = await recognizer_client.upload(b"placeholder")
    request = recognizer_client.request(
        ref.model_copy(update={"key": "attachments/absent.csv"}), file_type="csv"
    )
    await recognizer_client.send(request)

    _, result = await recognizer_client.ack_and_result()

    assert result.response.error is not None
    assert result.response.error.code == "NOT_FOUND"


async def test_unsafe_object_key_gets_invalid_request(start_recognizer, recognizer_client):
    await start_recognizer()
    ref = await recognizer_client.upload(b"placeholder")
    request = recognizer_client.request(
        ref.model_copy(update={"key": "../../etc/passwd"}), file_type="csv"
    )
    await recognizer_client.send(request)

    _, result = await recognizer_client.ack_and_result()

    assert result.response.error is not None
    assert result.response.error.code == "INVALID_REQUEST"


async def test_repeated_request_republishes_the_same_result_without_extracting_again(
    start_recognizer, recognizer_client
):
    recognizer = await start_recognizer()
    request = await recognizer_client.submit(INVOICE_CSV, file_type="csv")
    _, first = await recognizer_client.ack_and_result()

    await recognizer_client.send(request)
    again = await recognizer_client.next_answer()

    assert again == first  # same msg id, same body, no second ack
    assert recognizer.extractions == 1
    assert await recognizer_client.no_answer_within(0.2)


async def test_new_attempt_of_the_same_job_is_extracted_again(start_recognizer, recognizer_client):
    recognizer = await start_recognizer()
    first = await recognizer_client.submit(INVOICE_CSV, file_type="csv")
    await recognizer_client.ack_and_result()

    await recognizer_client.send(first.model_copy(update={"attempt": 2}))
    ack, result = await recognizer_client.ack_and_result()

    assert ack.msg_id == ack_msg_id(first.job_id, 2)
    assert result.msg_id == result_msg_id(first.job_id, 2)
    assert result.response.result_s3 is not None
    assert result.response.result_s3.key == result_key(first.job_id, 2)
    assert recognizer.extractions == 2


async def test_restarted_recognizer_reuses_the_stored_result(start_recognizer, recognizer_client):
    first_instance = await start_recognizer()
    request = await recognizer_client.submit(INVOICE_CSV, file_type="csv")
    _, first = await recognizer_client.ack_and_result()
    await first_instance.stop()

    second_instance = await start_recognizer()
    await recognizer_client.send(request)
    _, again = await recognizer_client.ack_and_result()

    assert again == first
    assert second_instance.extractions == 0


async def test_error_answers_are_remembered_too(start_recognizer, recognizer_client):
    recognizer = await start_recognizer()
    request = await recognizer_client.submit(b"\n", file_type="csv")
    _, first = await recognizer_client.ack_and_result()

    await recognizer_client.send(request)

    assert await recognizer_client.next_answer() == first
    assert recognizer.extractions == 1


async def test_lru_forgets_the_oldest_answer(start_recognizer, recognizer_client):
    recognizer = await start_recognizer(cache_size=1)
    older = await recognizer_client.submit(b"\n", file_type="csv")
    await recognizer_client.ack_and_result()
    await recognizer_client.submit(b"\n\n", file_type="csv")
    await recognizer_client.ack_and_result()

    # Error results have no stored object, so a forgotten one is worked out again.
    await recognizer_client.send(older)
    await recognizer_client.ack_and_result()
    assert recognizer.extractions == 3


async def test_fault_drop_acks_sends_only_the_result(start_recognizer, recognizer_client):
    await start_recognizer(RecognizerFaults(drop_acks=True))
    request = await recognizer_client.submit(INVOICE_CSV, file_type="csv")

    only = await recognizer_client.next_answer()

    assert only.msg_id == result_msg_id(request.job_id, 1)
    assert only.response.status == "done"
    assert await recognizer_client.no_answer_within(0.2)


async def test_fault_delay_holds_the_result_back(start_recognizer, recognizer_client):
    await start_recognizer(RecognizerFaults(delay_s=0.5))
    await recognizer_client.submit(INVOICE_CSV, file_type="csv")

    await recognizer_client.next_answer()  # the ack is not delayed
    acked = time.monotonic()
    result = await recognizer_client.next_answer()

    assert time.monotonic() - acked >= 0.45
    assert result.response.status == "done"


async def test_fault_duplicate_results_publishes_each_result_twice(
    start_recognizer, recognizer_client
):
    await start_recognizer(RecognizerFaults(duplicate_results=True))
    request = await recognizer_client.submit(INVOICE_CSV, file_type="csv")

    _, first = await recognizer_client.ack_and_result()
    second = await recognizer_client.next_answer()

    assert second == first
    assert second.msg_id == result_msg_id(request.job_id, 1)


async def test_fault_fail_with_answers_an_error_with_that_code(start_recognizer, recognizer_client):
    recognizer = await start_recognizer(RecognizerFaults(fail_with="OCR_ENGINE_DOWN"))
    await recognizer_client.submit(INVOICE_CSV, file_type="csv")

    _, result = await recognizer_client.ack_and_result()

    assert result.response.status == "error"
    assert result.response.error is not None
    assert result.response.error.code == "OCR_ENGINE_DOWN"
    assert recognizer.extractions == 0


async def test_fault_drop_results_acks_but_never_answers(start_recognizer, recognizer_client):
    await start_recognizer(RecognizerFaults(drop_results=True))
    request = await recognizer_client.submit(INVOICE_CSV, file_type="csv")

    ack = await recognizer_client.next_answer()
    store = recognizer_client.store
    bucket, key = store.bucket("results"), result_key(request.job_id, 1)
    for _ in range(100):  # the result is worked out and stored, just not published
        if await store.exists(bucket, key):
            break
        await asyncio.sleep(0.02)

    assert ack.response.status == "processing"
    assert await store.exists(bucket, key)
    assert await recognizer_client.no_answer_within(0.3)


async def test_faults_can_be_switched_at_runtime(start_recognizer, recognizer_client):
    recognizer = await start_recognizer(RecognizerFaults(drop_results=True))
    request = await recognizer_client.submit(INVOICE_CSV, file_type="csv")
    await recognizer_client.next_answer()  # the ack

    recognizer.faults = RecognizerFaults()
    await recognizer_client.send(request)

    result = await recognizer_client.next_answer()
    assert result.response.status == "done"
    assert recognizer.extractions == 1


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2, 3]",
        b'{"job_id": "not-a-uuid"}',
        b'{"job_id": "3f0c6b5e-2a55-4d8a-9a63-5d4f1c0b9e21", "file_id": 1}',
    ],
    ids=["not-json", "not-an-object", "bad-job-id", "missing-fields"],
)
async def test_invalid_requests_are_dropped_and_good_ones_still_answered(
    start_recognizer, recognizer_client, recognizer_settings, body
):
    await start_recognizer()
    nats_settings = recognizer_settings.nats
    await recognizer_client.publish_raw(nats_settings.subject(nats_settings.tabular_subject), body)
    await recognizer_client.publish_raw(nats_settings.subject(nats_settings.image_subject), body)
    request = await recognizer_client.submit(INVOICE_CSV, file_type="csv")

    ack, result = await recognizer_client.ack_and_result()

    assert ack.response.job_id == result.response.job_id == request.job_id
    assert await recognizer_client.no_answer_within(0.2)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def test_invalid_request_log_line_carries_no_body(
    start_recognizer, recognizer_client, recognizer_settings
):
    await start_recognizer()
    nats_settings = recognizer_settings.nats
    secret = b'{"job_id": "x", "original_name": "salary-of-the-ceo.csv"}'
    handler = _Lines()
    logger = logging.getLogger("mailroom.service.requests")
    logger.addHandler(handler)
    # Its own level, not the root's: another test in this process may have left the root
    # above WARNING (a full run once caught no line here; alone it always did).
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        await recognizer_client.publish_raw(
            nats_settings.subject(nats_settings.tabular_subject), secret
        )
        await recognizer_client.submit(INVOICE_CSV, file_type="csv")
        await recognizer_client.ack_and_result()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)

    (line,) = [line for line in handler.lines if "invalid request" in line]
    assert "salary" not in line
    assert f"{len(secret)} bytes" in line
    assert "'x'" in line  # the job id, escaped


async def test_requests_share_the_queue_group(start_recognizer, recognizer_client):
    first = await start_recognizer()
    second = await start_recognizer()
    for _ in range(6):
        await recognizer_client.submit(INVOICE_CSV + os.urandom(4).hex().encode(), file_type="csv")

    answers = [await recognizer_client.next_answer() for _ in range(12)]

    assert sum(a.response.status == "done" for a in answers) == 6
    assert first.extractions + second.extractions == 6


async def test_stop_finishes_requests_in_flight(start_recognizer, recognizer_client):
    recognizer = await start_recognizer(RecognizerFaults(delay_s=0.3))
    await recognizer_client.submit(INVOICE_CSV, file_type="csv")
    await recognizer_client.next_answer()  # acked: the request is in flight

    await recognizer.stop()

    result = await recognizer_client.next_answer()
    assert result.response.status == "done"


def test_faults_parse_from_settings():
    faults = RecognizerFaults.from_settings(
        RecognizerSettings(faults=" drop_acks, duplicate_results ,fail_with=BAD", delay_s=1.5)
    )
    assert faults == RecognizerFaults(
        drop_acks=True, duplicate_results=True, fail_with="BAD", delay_s=1.5
    )
    assert RecognizerFaults.parse("") == RecognizerFaults()
    assert RecognizerFaults.parse("drop_results,delay_s=0.25") == RecognizerFaults(
        drop_results=True, delay_s=0.25
    )
    with pytest.raises(ValueError, match="unknown recognizer fault"):
        RecognizerFaults.parse("drop_everything")


def test_recognizer_command_answers_with_env_faults_and_exits_0_on_sigterm(
    recognizer_settings, tmp_path
):
    env = {
        **os.environ,
        "MAILROOM_STATE_DIR": str(tmp_path),
        "MAILROOM_NATS__URL": recognizer_settings.nats.url,
        "MAILROOM_NATS__ALLOW_ANONYMOUS": "true",
        "MAILROOM_NATS__SUBJECT_PREFIX": recognizer_settings.nats.subject_prefix,
        "MAILROOM_RECOGNIZER__FAULTS": "drop_acks",
        "MAILROOM_RECOGNIZER__SERVICE_NAME": "ref-under-test",
    }
    command = [str(Path(sys.executable).parent / "mailroom"), "recognizer"]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path
    )
    try:
        answer = asyncio.run(_ask_until_answered(recognizer_settings))
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert answer.response.status == "done"  # the first answer: no ack (drop_acks)
    assert answer.response.service.name == "ref-under-test"
    assert process.returncode == 0, stderr.decode(errors="replace")[-2000:]


async def _ask_until_answered(settings):
    from mailroom.adapters.storage import build_store
    from tests.fixtures.recognizer import RecognizerClient

    client = RecognizerClient(settings, build_store(settings))
    await client.connect()
    try:
        request = await client.submit(INVOICE_CSV, file_type="csv")
        for _ in range(100):  # republish until the process has subscribed (idempotent)
            try:
                return await client.next_answer(timeout_s=0.2)
            except TimeoutError:
                await client.send(request)
        raise AssertionError("the recognizer process never answered")
    finally:
        await client.close()


async def test_result_file_is_the_contract_json(start_recognizer, recognizer_client):
    await start_recognizer()
    request = await recognizer_client.submit(INVOICE_CSV, file_type="csv")
    _, result = await recognizer_client.ack_and_result()

    ref = result.response.result_s3
    raw = json.loads(await recognizer_client.store.get(ref.bucket, ref.key))

    assert raw["schema_version"] == "1.0"
    assert raw["job_id"] == str(request.job_id)
    assert raw["fields"]["total"] == {"value": "10.50", "confidence": 0.99}


async def test_recognizer_is_usable_as_an_async_context_manager(
    recognizer_settings, recognizer_client
):
    async with ReferenceRecognizer(recognizer_settings) as recognizer:
        await recognizer_client.submit(INVOICE_CSV, file_type="csv")
        await recognizer_client.ack_and_result()
    assert recognizer.extractions == 1


async def test_answers_published_together_share_one_flush(start_recognizer):
    recognizer = await start_recognizer()
    answers = recognizer.kit.answers  # no stream captures the subject: core NATS
    connection = answers.nc
    flush, flushes = connection.flush, []

    async def counted_flush(*args: object, **kwargs: object) -> None:
        flushes.append(1)
        await flush(*args, **kwargs)

    connection.flush = counted_flush  # type: ignore[method-assign]
    await asyncio.gather(*(answers.flush() for _ in range(5)))
    assert len(flushes) == 1  # one PING for the five answers of one turn

    await answers.flush()
    assert len(flushes) == 2  # a later answer waits for a flush begun after it
