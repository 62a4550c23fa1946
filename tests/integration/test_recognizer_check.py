"""`mailroom recognizer check` against the reference recognizer, well-behaved and faulty."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mailroom.adapters.storage import build_store
from mailroom.recognition.contract.conformance import CheckRow, CheckTimeouts, check_service
from mailroom.recognition.contract.models import RecognitionResponse, dump
from mailroom.recognizer.faults import RecognizerFaults
from mailroom.recognizer.service import ReferenceRecognizer
from mailroom.service import Failure
from mailroom.service.wire import flushed

pytestmark = pytest.mark.integration

#: Short waits: the reference recognizer answers in milliseconds.
TIMEOUTS = CheckTimeouts(ack_s=1.0, result_s=1.5)

ACKS = {"ack (tabular)", "ack (image)"}
RESULTS = {"result (tabular)", "result (image)"}


async def _rows(settings, *, buckets: bool = True) -> list[CheckRow]:
    store = build_store(settings)
    if buckets:  # as `mailroom migrate` would have
        await store.create_buckets()
    return await check_service(settings, store=store, timeouts=TIMEOUTS)


async def _check(settings) -> dict[str, bool]:
    return {row.name: row.passed for row in await _rows(settings)}


def _failed(rows: dict[str, bool]) -> set[str]:
    return {name for name, passed in rows.items() if not passed}


async def test_the_reference_recognizer_passes_every_check(start_recognizer, recognizer_settings):
    await start_recognizer()

    rows = await _check(recognizer_settings)

    assert len(rows) == 13
    assert _failed(rows) == set()


async def test_duplicate_results_under_one_msg_id_are_tolerated(
    start_recognizer, recognizer_settings
):
    await start_recognizer(RecognizerFaults(duplicate_results=True))

    assert _failed(await _check(recognizer_settings)) == set()


async def test_dropped_acks_fail_the_ack_rows_only(start_recognizer, recognizer_settings):
    await start_recognizer(RecognizerFaults(drop_acks=True))

    assert _failed(await _check(recognizer_settings)) == ACKS


async def test_dropped_results_fail_the_result_rows(start_recognizer, recognizer_settings):
    await start_recognizer(RecognizerFaults(drop_results=True))

    failed = _failed(await _check(recognizer_settings))

    assert RESULTS <= failed
    assert "missing object → error" in failed
    assert not failed & ACKS


async def test_a_service_failing_every_file_fails_the_result_rows_only(
    start_recognizer, recognizer_settings
):
    await start_recognizer(RecognizerFaults(fail_with="OCR_FAILED"))

    # The document row fails too: no sample result named a document.
    assert _failed(await _check(recognizer_settings)) == {
        *RESULTS,
        "result documents match the contract",
    }


async def test_results_later_than_the_deadline_fail_the_result_rows(
    start_recognizer, recognizer_settings
):
    await start_recognizer(RecognizerFaults(delay_s=TIMEOUTS.result_s + 0.5))

    failed = _failed(await _check(recognizer_settings))

    assert RESULTS <= failed
    assert not failed & ACKS


class _UuidFileIds(ReferenceRecognizer):
    """Answers with a UUID ``file_id``: the mistake the issue's first outside service made."""

    async def start(self) -> None:
        await super().start()
        answers = self.kit.answers

        async def publish(response: RecognitionResponse, msg_id: str) -> None:
            body = response.model_dump_json(exclude_none=True)
            broken = body.replace(f'"file_id":{response.file_id}', f'"file_id":"{response.job_id}"')
            await answers.publish(broken.encode(), msg_id)

        self.kit.publish = publish  # type: ignore[method-assign]


async def test_a_message_off_the_contract_fails_the_contract_row(recognizer_settings):
    async with _UuidFileIds(recognizer_settings):
        failed = _failed(await _check(recognizer_settings))

    assert "messages match the contract" in failed
    assert "message ids" not in failed


class _CorePublisher(ReferenceRecognizer):
    """Publishes its answers with core NATS, as if no stream captured the answers subject."""

    async def start(self) -> None:
        await super().start()
        nc, subject = self.kit.nc, self.results_subject

        async def publish(response: RecognitionResponse, msg_id: str) -> None:
            await nc.publish(subject, dump(response), headers={"Nats-Msg-Id": msg_id})
            await flushed(nc)

        self.kit.publish = publish  # type: ignore[method-assign]


async def test_answers_published_with_core_nats_into_the_stream_are_explained(
    recognizer_settings,
):
    async with _CorePublisher(recognizer_settings):
        rows = {row.name: row for row in await _rows(recognizer_settings)}

    row = rows["answers through JetStream"]
    assert not row.passed
    assert "published with core NATS into" in row.detail
    assert "use js.publish, wait for its PubAck and retry under the same Nats-Msg-Id" in row.detail
    assert "\n" not in row.detail
    assert rows["result (tabular)"].passed


class _NoPubAckWait(ReferenceRecognizer):
    """Publishes with JetStream's reply subject but never waits for the PubAck (fire and forget)."""

    async def start(self) -> None:
        await super().start()
        nc, subject = self.kit.nc, self.results_subject

        async def publish(response: RecognitionResponse, msg_id: str) -> None:
            await nc.publish(
                subject, dump(response), reply=nc.new_inbox(), headers={"Nats-Msg-Id": msg_id}
            )

        self.kit.publish = publish  # type: ignore[method-assign]


async def test_a_service_that_does_not_wait_for_the_puback_is_told_so(recognizer_settings):
    async with _NoPubAckWait(recognizer_settings):
        rows = {row.name: row for row in await _rows(recognizer_settings)}

    assert rows["answers through JetStream"].passed
    probe = rows["PubAck awaited, then retried"]
    assert not probe.passed
    assert "got no PubAck and the service went on to the next answer" in probe.detail
    assert "publish it again under the same Nats-Msg-Id until it comes" in probe.detail


async def test_the_probe_leaves_a_stream_it_did_not_create_alone(
    start_recognizer, recognizer_settings
):
    await start_recognizer()
    await _rows(recognizer_settings)  # creates the stream

    rows = {row.name: row for row in await _rows(recognizer_settings)}

    probe = rows["PubAck awaited, then retried"]
    assert probe.passed and probe.warned and "not probed" in probe.detail


async def test_a_missing_bucket_is_reported_as_such(start_recognizer, recognizer_settings):
    await start_recognizer()

    rows = {row.name: row for row in await _rows(recognizer_settings, buckets=False)}

    assert not rows["buckets"].passed
    results = recognizer_settings.storage.results_bucket
    assert f"{results} does not exist: `mailroom migrate` creates" in rows["buckets"].detail


class _OwnShapeDocuments:
    """A store that writes every result document in a shape of its own."""

    def __init__(self, store) -> None:
        self._store = store

    def __getattr__(self, name):
        return getattr(self._store, name)

    async def put(self, role, key, data, **kwargs):
        if role == "results":
            data = OWN_SHAPE
        return await self._store.put(role, key, data, **kwargs)

    async def put_many(self, requests):
        # The reference recognizer stores the documents of jobs finishing together at once.
        return await self._store.put_many(
            [replace(r, data=OWN_SHAPE) if r.role == "results" else r for r in requests]
        )


OWN_SHAPE = b'{"invoice": {"total": 1250.5}}'


async def test_a_result_document_off_the_contract_fails_the_document_row(recognizer_settings):
    store = _OwnShapeDocuments(build_store(recognizer_settings))
    async with ReferenceRecognizer(recognizer_settings, store=store):
        failed = _failed(await _check(recognizer_settings))

    assert failed == {"result documents match the contract"}


class _ChangesItsMind(ReferenceRecognizer):
    """Remembers nothing and answers a repeated request with another answer."""

    seen: set

    async def start(self) -> None:
        await super().start()
        kit, first_answer = self.kit, self.kit.answer

        async def answer(request):
            if request.job_id in self.seen:
                return kit._error(request, "EMPTY", "another answer")
            self.seen.add(request.job_id)
            return await first_answer(request)

        kit.answer = answer  # type: ignore[method-assign]
        kit.remember = lambda key, answer: None  # type: ignore[method-assign]


async def test_another_answer_to_a_repeated_request_fails_the_idempotency_row(
    recognizer_settings,
):
    _ChangesItsMind.seen = set()
    async with _ChangesItsMind(recognizer_settings):
        failed = _failed(await _check(recognizer_settings))

    assert failed == {"idempotency (same request twice)"}


async def test_the_command_prints_the_table_and_exits_0_for_the_reference(
    start_recognizer, recognizer_settings, tmp_path
):
    await build_store(recognizer_settings).create_buckets()
    await start_recognizer()
    env = {
        **os.environ,
        "MAILROOM_STATE_DIR": str(tmp_path),
        "MAILROOM_NATS__SUBJECT_PREFIX": recognizer_settings.nats.subject_prefix,
        "MAILROOM_NATS__STREAM_NAME": recognizer_settings.nats.stream_name,
        "MAILROOM_NATS__ALLOW_ANONYMOUS": "true",
        "COLUMNS": "160",
    }
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "mailroom"),
        "recognizer",
        "check",
        "--nats",
        recognizer_settings.nats.url,
        "--ack-timeout",
        "2",
        "--result-timeout",
        "3",
        env=env,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 30)

    output = stdout.decode()
    print(output)
    assert process.returncode == 0, stderr.decode(errors="replace")[-2000:]
    assert "idempotency" in output
    assert "FAIL" not in output


def test_an_unreachable_nats_is_one_line_without_the_password(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from mailroom.cli import app

    monkeypatch.setenv("MAILROOM_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("MAILROOM_NATS__INITIAL_CONNECT_ATTEMPTS", "1")

    result = CliRunner().invoke(app, ["recognizer", "check", "--nats", "nats://u:pw@127.0.0.1:1"])

    assert result.exit_code == 1
    assert "cannot reach NATS" in result.output
    assert "pw@" not in result.output


class _CsvOnly(ReferenceRecognizer):
    """Reads CSV only and answers UNSUPPORTED_TYPE to anything else."""

    async def recognize(self, request, data):
        if request.file_type != "csv":
            return Failure("UNSUPPORTED_TYPE", f"{request.file_type} is not read here")
        return await super().recognize(request, data)


def _declaring(settings, file_types):
    recognition = settings.recognition.model_copy(update={"file_types": file_types})
    return settings.model_copy(update={"recognition": recognition})


async def test_a_csv_only_service_passes_when_only_csv_is_declared(recognizer_settings):
    settings = _declaring(recognizer_settings, {"tabular": ["csv"]})
    async with _CsvOnly(settings):
        rows = await _rows(settings)

    names = {row.name for row in rows}
    assert not {row.name for row in rows if not row.passed}
    assert "result (tabular)" in names and "result (image)" not in names


async def test_a_declared_type_without_a_sample_is_said_so(start_recognizer, recognizer_settings):
    settings = _declaring(recognizer_settings, {"tabular": ["xlsx"], "image": ["png"]})
    await start_recognizer()

    rows = {row.name: row for row in await _rows(settings)}

    assert not rows["file types (tabular)"].passed
    assert "declares xlsx, of which the check has no sample" in rows["file types (tabular)"].detail
    assert rows["result (image)"].passed
