"""A partner's service written with the kit alone (no Mailroom adapter) passes the checker."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import nats
import pytest

from mailroom.adapters.storage import build_store
from mailroom.recognition.contract.conformance import CheckTimeouts, check_service
from mailroom.recognition.contract.models import (
    ObjectRef,
    RecognitionRequest,
    RecognitionResult,
    ResultField,
    ServiceInfo,
)
from mailroom.service import Failure, RecognitionService, answering

pytestmark = pytest.mark.integration


class FolderObjects:
    """The partner's own store: buckets are folders, as Mailroom's filesystem store keeps them."""

    def __init__(self, root: Path, results_bucket: str) -> None:
        self.root = root
        self.results_bucket = results_bucket

    async def read(self, bucket: str, key: str) -> bytes | None:
        path = self.root / bucket / key
        return path.read_bytes() if path.exists() else None

    async def write_result(self, key: str, body: bytes) -> ObjectRef:
        path = self.root / self.results_bucket / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        return ObjectRef(bucket=self.results_bucket, key=key)


async def read_csv_total(request, data: bytes) -> RecognitionResult | Failure:
    if request.file_type != "csv":
        return Failure("UNSUPPORTED_TYPE", "CSV only", permanent=True)
    header, values = (line.split(",") for line in data.decode().splitlines()[:2])
    fields = {
        name: ResultField(value=value, confidence=0.95)
        for name, value in zip(header, values, strict=True)
    }
    return RecognitionResult(job_id=request.job_id, document_type="invoice", fields=fields)


async def test_a_csv_only_service_on_the_kit_passes_the_check(recognizer_settings):
    settings = recognizer_settings.model_copy(
        update={
            "recognition": recognizer_settings.recognition.model_copy(
                update={"file_types": {"tabular": ["csv"]}}
            )
        }
    )
    store = build_store(settings)
    await store.create_buckets()
    s = settings.nats
    nc = await nats.connect(s.url)
    service = RecognitionService(
        nc,
        objects=FolderObjects(settings.storage_root, settings.storage.results_bucket),
        recognize=read_csv_total,
        service=ServiceInfo(name="partner-csv", version="0.1"),
        request_subjects=[s.subject(s.tabular_subject), s.subject(s.image_subject)],
        answers_subject=s.subject(s.results_subject),
    )
    await service.start()
    try:
        rows = await check_service(
            settings, store=store, timeouts=CheckTimeouts(ack_s=1.0, result_s=1.5)
        )
    finally:
        await service.stop()
        await nc.drain()

    assert {row.name for row in rows if not row.passed} == set(), rows
    assert "result (tabular)" in {row.name for row in rows}
    assert "answers through JetStream" in {row.name for row in rows}


def test_a_failure_marked_permanent_says_so_in_the_answer():
    failure = Failure("UNSUPPORTED_TYPE", "CSV only", permanent=True)

    answer = answering.error(uuid.uuid4(), 1, failure, ServiceInfo(name="p", version="1"))

    assert answer.status == "error"
    assert answer.error is not None and answer.error.permanent is True


class BrokenObjects(FolderObjects):
    """A store that is down for one key and refuses another."""

    async def read(self, bucket: str, key: str) -> bytes | None:
        if key.startswith("down/"):
            raise ConnectionError("store unreachable")
        if key.startswith("odd/"):
            raise ValueError("not a key this store takes")
        return await super().read(bucket, key)


async def test_store_failures_are_answered_with_their_codes(recognizer_settings, tmp_path):
    s = recognizer_settings.nats
    nc = await nats.connect(s.url)
    service = RecognitionService(
        nc,
        objects=BrokenObjects(tmp_path, "results"),
        recognize=read_csv_total,
        service=ServiceInfo(name="partner-csv", version="0.1"),
        request_subjects=[s.subject(s.tabular_subject)],
        answers_subject=s.subject(s.results_subject),
    )
    try:
        codes = {}
        for key in ("down/a.csv", "odd/a.csv", "gone/a.csv"):
            request = RecognitionRequest(
                job_id=uuid.uuid4(),
                file_id=1,
                pipeline="tabular",
                file_type="csv",
                original_name="a.csv",
                s3=ObjectRef(bucket="incoming", key=key),
                reply_deadline=datetime.now(UTC),
                attempt=1,
            )
            answer = await service.answer(request)
            codes[key] = answer.error.code if answer.error else answer.status
    finally:
        await nc.close()

    assert codes == {
        "down/a.csv": "STORAGE_UNAVAILABLE",
        "odd/a.csv": "INVALID_REQUEST",
        "gone/a.csv": "NOT_FOUND",
    }
