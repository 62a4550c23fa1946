"""The rule book as `mailroom recognizer check` applies it, against a service written from the
contract alone that makes the mistakes each test asks for.

Each test has its twin on the system's side (``test_contract_rules_system.py``): a string
``file_id`` fails, a file that needs a check is never re-sent, an error's class decides whether it
is re-sent, an answer without ``Nats-Msg-Id`` and a result before its ack pass with a warning.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import nats
import pytest

from mailroom.adapters.storage import build_store
from mailroom.errors import AppError
from mailroom.recognition.contract.conformance import CheckRow, CheckTimeouts, check_service
from mailroom.service.wire import flushed

pytestmark = pytest.mark.integration

TIMEOUTS = CheckTimeouts(ack_s=1.0, result_s=1.5)
SAMPLE_FIELDS = {
    "invoice_number": {"value": "CHECK-1", "confidence": 0.99},
    "total": {"value": 1250.5, "confidence": 0.99},
}


class ScriptedService:
    """A recognition service from the contract: JetStream publishes, one answer per attempt."""

    def __init__(
        self,
        settings: Any,
        *,
        string_file_id: bool = False,
        no_msg_id: bool = False,
        result_before_ack: bool = False,
        sample_status: str = "done",
        missing_error: dict[str, Any] | None = None,
        schema_version: str | None = None,
    ) -> None:
        self.settings = settings
        self.store = build_store(settings)
        self.string_file_id = string_file_id
        self.no_msg_id = no_msg_id
        self.result_before_ack = result_before_ack
        self.sample_status = sample_status
        self.missing_error = missing_error or {"code": "NOT_FOUND", "message": "no such object"}
        self.answers: dict[tuple[Any, Any], list[tuple[dict[str, Any], str]]] = {}
        self.schema_version = schema_version

    async def __aenter__(self) -> ScriptedService:
        s = self.settings.nats
        self.nc = await nats.connect(s.url)
        self.js = self.nc.jetstream()
        self.results_subject = s.subject(s.results_subject)
        for subject in (s.tabular_subject, s.image_subject):
            await self.nc.subscribe(s.subject(subject), queue="scripted", cb=self._on_request)
        await flushed(self.nc)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.nc.close()

    async def _on_request(self, msg: Any) -> None:
        request = json.loads(msg.data)
        key = (request.get("job_id"), request.get("attempt"))
        if key not in self.answers:  # a repeat gets the same answers again
            self.answers[key] = await self._answers(request)
        for body, kind in self.answers[key]:
            msg_id = f"{request['job_id']}:{request['attempt']}:{kind}"
            headers = None if self.no_msg_id else {"Nats-Msg-Id": msg_id}
            await self._publish(json.dumps(body).encode(), headers)

    async def _publish(self, data: bytes, headers: dict[str, str] | None) -> None:
        """``js.publish``, again under the same headers until the stream acknowledges it."""
        for _ in range(20):
            try:
                await self.js.publish(self.results_subject, data, headers=headers, timeout=0.5)
                return
            except nats.errors.TimeoutError:
                continue

    async def _answers(self, request: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
        file_id = request["file_id"]
        answer = {
            "job_id": request["job_id"],
            "file_id": str(file_id) if self.string_file_id else file_id,
            "service": {"name": "scripted", "version": "1"},
        }
        if self.schema_version is not None:
            answer["schema_version"] = self.schema_version
        ack = ({**answer, "status": "processing"}, "ack")
        result = ({**answer, **await self._result(request)}, "result")
        return [result, ack] if self.result_before_ack else [ack, result]

    async def _result(self, request: dict[str, Any]) -> dict[str, Any]:
        s3 = request.get("s3")
        if request.get("pipeline") not in ("tabular", "image") or not isinstance(s3, dict):
            return {"status": "error", "error": {"code": "INVALID_REQUEST", "message": "bad"}}
        try:
            await self.store.get(s3["bucket"], s3["key"])
        except AppError:
            return {"status": "error", "error": self.missing_error}
        document = {"job_id": request["job_id"], "document_type": "invoice"}
        ref = await self.store.put(
            "results",
            f"results/{request['job_id']}.{request['attempt']}.json",
            json.dumps({**document, "fields": SAMPLE_FIELDS}).encode(),
            media_type="application/json",
        )
        return {"status": self.sample_status, "result_s3": {"bucket": ref.bucket, "key": ref.key}}


async def _rows(settings, **mistakes) -> dict[str, CheckRow]:
    store = build_store(settings)
    await store.create_buckets()
    async with ScriptedService(settings, **mistakes):
        rows = await check_service(settings, store=store, timeouts=TIMEOUTS)
    return {row.name: row for row in rows}


def _verdicts(rows: dict[str, CheckRow]) -> dict[str, str]:
    return {
        name: "fail" if not row.passed else "warn" if row.warned else "pass"
        for name, row in rows.items()
    }


async def test_a_service_that_keeps_every_rule_passes_without_a_warning(recognizer_settings):
    rows = await _rows(recognizer_settings)

    assert set(_verdicts(rows).values()) == {"pass"}, _verdicts(rows)
    assert "NOT_FOUND is permanent: the file ends ERROR, never re-sent" in (
        rows["missing object → error"].detail
    )


async def test_a_service_of_the_previous_contract_version_still_passes(recognizer_settings):
    # 1.0 knows no `error.permanent`; its answers read as they always did.
    rows = await _rows(recognizer_settings, schema_version="1.0")

    assert set(_verdicts(rows).values()) == {"pass"}, _verdicts(rows)


async def test_a_string_file_id_fails_as_the_inbox_fails_the_job(recognizer_settings):
    rows = await _rows(recognizer_settings, string_file_id=True)

    failed = {name for name, verdict in _verdicts(rows).items() if verdict == "fail"}
    assert {"result (tabular)", "messages match the contract"} <= failed
    detail = rows["result (tabular)"].detail
    assert detail.startswith("file_id: Input should be a valid integer")
    assert "Mailroom ends the job INVALID_RESULT" in detail


async def test_a_needs_check_answer_passes_and_says_it_is_never_re_sent(recognizer_settings):
    rows = await _rows(recognizer_settings, sample_status="needs_check")

    row = rows["result (tabular)"]
    assert row.passed and not row.warned
    assert "its file waits for a person (never re-sent)" in row.detail


@pytest.mark.parametrize(
    ("error", "said"),
    [
        ({"code": "NOT_FOUND"}, "NOT_FOUND is permanent: the file ends ERROR, never re-sent"),
        ({"code": "INTERNAL_ERROR"}, "INTERNAL_ERROR is retryable: re-sent as a new attempt"),
        (
            {"code": "INTERNAL_ERROR", "permanent": True},
            "INTERNAL_ERROR is permanent: the file ends ERROR, never re-sent",
        ),
    ],
)
async def test_the_error_row_says_whether_mailroom_re_sends_it(recognizer_settings, error, said):
    rows = await _rows(recognizer_settings, missing_error=error)

    assert rows["missing object → error"].passed
    assert rows["missing object → error"].detail == said


async def test_answers_without_a_msg_id_pass_with_a_warning(recognizer_settings):
    rows = await _rows(recognizer_settings, no_msg_id=True)

    verdicts = _verdicts(rows)
    assert "fail" not in verdicts.values(), verdicts
    assert verdicts["message ids"] == "warn"
    assert "Mailroom accepts it as" in rows["message ids"].detail
    assert verdicts["answers through JetStream"] == "warn"


async def test_a_result_before_its_ack_passes_with_a_warning(recognizer_settings):
    rows = await _rows(recognizer_settings, result_before_ack=True)

    verdicts = _verdicts(rows)
    assert "fail" not in verdicts.values(), verdicts
    assert verdicts["ack (tabular)"] == verdicts["ack (image)"] == "warn"
    assert "the result came before the ack" in rows["ack (tabular)"].detail


async def test_the_command_fails_a_wrong_service_in_its_table_and_exits_1(
    recognizer_settings, tmp_path
):
    await build_store(recognizer_settings).create_buckets()
    n = recognizer_settings.nats
    env = {
        **os.environ,
        "MAILROOM_STATE_DIR": str(tmp_path),
        "MAILROOM_NATS__SUBJECT_PREFIX": n.subject_prefix,
        "MAILROOM_NATS__STREAM_NAME": n.stream_name,
        "MAILROOM_NATS__ALLOW_ANONYMOUS": "true",
        "COLUMNS": "200",
    }
    mistakes = {"string_file_id": True, "no_msg_id": True, "result_before_ack": True}
    async with ScriptedService(recognizer_settings, **mistakes):
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "mailroom"),
            *("recognizer", "check", "--nats", n.url, "--ack-timeout", "2"),
            *("--result-timeout", "3"),
            env=env,
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), 30)

    output = stdout.decode()
    print(output, stderr.decode(errors="replace"))
    assert process.returncode == 1
    assert "FAIL" in output and "warn" in output
    assert "valid integer" in output and "Mailroom accepts it as" in output
    assert stderr.decode().strip().endswith("checks failed")
