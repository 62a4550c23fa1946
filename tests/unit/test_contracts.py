"""The NATS contract: checked-in JSON Schemas match the models, and the models validate."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from mailroom.recognition.contract.models import (
    CONTRACTS_DIR,
    SCHEMA_VERSION,
    SCHEMAS,
    ObjectRef,
    RecognitionRequest,
    RecognitionResponse,
    RecognitionResult,
    ServiceInfo,
    ack_msg_id,
    dump,
    parse_json_object,
    render_schema,
    request_msg_id,
    result_msg_id,
    write_schemas,
)

REGENERATE = "uv run python -m mailroom.recognition.contract --write"
JOB_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def _request(**overrides):
    body = {
        "schema_version": "1.0",
        "job_id": str(JOB_ID),
        "file_id": 7,
        "pipeline": "tabular",
        "file_type": "csv",
        "original_name": "invoice.csv",
        "s3": {"bucket": "mailroom-incoming", "key": "attachments/ab/abc.csv"},
        "reply_deadline": "2030-01-01T00:00:00+00:00",
        "attempt": 1,
    }
    body.update(overrides)
    return body


def _response(**overrides):
    body = {
        "schema_version": "1.0",
        "job_id": str(JOB_ID),
        "file_id": 7,
        "status": "done",
        "service": {"name": "svc", "version": "1"},
        "result_s3": {"bucket": "mailroom-results", "key": "results/x/1.json"},
        "result_schema_version": "1.0",
        "metrics": {"fields_total": 2, "fields_low_confidence": 0, "fields_unrecognized": 0},
    }
    body.update(overrides)
    return body


@pytest.mark.parametrize("stem", sorted(SCHEMAS))
def test_checked_in_schema_matches_the_model(stem):
    path = CONTRACTS_DIR / f"{stem}.schema.json"
    assert path.exists(), f"{path.name} is missing from contracts/; run `{REGENERATE}`"
    assert path.read_text() == render_schema(SCHEMAS[stem]), (
        f"contracts/{path.name} is out of date with mailroom/recognition/contract/models.py; "
        f"run `{REGENERATE}` and commit the result"
    )


def test_no_stray_schema_files_in_contracts():
    stems = {p.name.removesuffix(".schema.json") for p in CONTRACTS_DIR.glob("*.schema.json")}
    assert stems == set(SCHEMAS), f"contracts/ and SCHEMAS disagree; run `{REGENERATE}`"


def test_write_schemas_renders_valid_json_for_every_model(tmp_path):
    written = write_schemas(tmp_path)
    assert sorted(p.name for p in written) == sorted(f"{s}.schema.json" for s in SCHEMAS)
    for path in written:
        schema = json.loads(path.read_text())
        assert schema["type"] == "object"
        assert "job_id" in schema["properties"]


def test_msg_ids_are_built_from_job_id_and_attempt():
    assert request_msg_id(JOB_ID, 2) == f"{JOB_ID}:2:request"
    assert ack_msg_id(str(JOB_ID), 1) == f"{JOB_ID}:1:ack"
    assert result_msg_id(JOB_ID, 3) == f"{JOB_ID}:3:result"


def test_valid_request_parses():
    request = RecognitionRequest.model_validate(_request())
    assert request.job_id == JOB_ID
    assert request.s3 == ObjectRef(bucket="mailroom-incoming", key="attachments/ab/abc.csv")
    assert request.reply_deadline == datetime(2030, 1, 1, tzinfo=UTC)


def test_unknown_keys_are_tolerated_everywhere():
    request = RecognitionRequest.model_validate(
        _request(priority="high", s3={"bucket": "b", "key": "k", "region": "eu"})
    )
    assert not hasattr(request, "priority")
    response = RecognitionResponse.model_validate(
        _response(trace_id="abc", service={"name": "svc", "version": "1", "host": "h"})
    )
    assert response.service == ServiceInfo(name="svc", version="1")


def test_metrics_keep_extra_service_keys():
    response = RecognitionResponse.model_validate(
        _response(metrics={"fields_total": 1, "pages": 3})
    )
    assert response.metrics is not None
    assert response.metrics.fields_total == 1
    assert response.metrics.model_dump()["pages"] == 3


@pytest.mark.parametrize(
    ("model", "body"),
    [
        (RecognitionRequest, {k: v for k, v in _request().items() if k != "job_id"}),
        (RecognitionRequest, _request(job_id="not-a-uuid")),
        (RecognitionRequest, _request(pipeline="audio")),
        (RecognitionRequest, _request(attempt=0)),
        (RecognitionRequest, _request(schema_version="2.0")),
        (RecognitionRequest, _request(s3={"bucket": "", "key": "k"})),
        (RecognitionResponse, {k: v for k, v in _response().items() if k != "job_id"}),
        (RecognitionResponse, _response(status="finished")),
        (RecognitionResponse, _response(metrics={"fields_total": -1})),
        (RecognitionResponse, _response(metrics={"fields_low_confidence": -3})),
        (RecognitionResponse, _response(error={"code": ""})),
        (RecognitionResult, {"job_id": str(JOB_ID), "document_type": ""}),
        (
            RecognitionResult,
            {
                "job_id": str(JOB_ID),
                "document_type": "invoice",
                "fields": {"total": {"value": "1", "confidence": 1.5}},
            },
        ),
    ],
    ids=[
        "request-missing-job-id",
        "request-bad-job-id",
        "request-wrong-pipeline",
        "request-attempt-zero",
        "request-wrong-schema-version",
        "request-empty-bucket",
        "response-missing-job-id",
        "response-wrong-status",
        "response-negative-total",
        "response-negative-low-confidence",
        "response-empty-error-code",
        "result-empty-document-type",
        "result-confidence-above-one",
    ],
)
def test_invalid_messages_are_rejected(model, body):
    with pytest.raises(ValidationError):
        model.model_validate(body)


def test_models_are_frozen():
    response = RecognitionResponse.model_validate(_response())
    with pytest.raises(ValidationError):
        response.status = "error"  # type: ignore[misc]


def test_dump_is_compact_json_without_nulls_and_round_trips():
    ack = RecognitionResponse(
        job_id=JOB_ID, file_id=7, status="processing", service=ServiceInfo(name="s", version="1")
    )
    wire = dump(ack)
    assert isinstance(wire, bytes)
    body = json.loads(wire)
    assert body == {
        "schema_version": SCHEMA_VERSION,
        "job_id": str(JOB_ID),
        "file_id": 7,
        "status": "processing",
        "service": {"name": "s", "version": "1"},
    }
    assert RecognitionResponse.model_validate_json(wire) == ack
    assert ack.is_ack


def test_dump_of_a_request_serialises_deadline_as_iso_8601():
    request = RecognitionRequest.model_validate(_request())
    body = json.loads(dump(request))
    assert datetime.fromisoformat(body["reply_deadline"].replace("Z", "+00:00")) == datetime(
        2030, 1, 1, tzinfo=UTC
    )
    assert RecognitionRequest.model_validate(body) == request


@pytest.mark.parametrize("data", [b"[1, 2]", b'"text"', b"42", b"null"])
def test_parse_json_object_refuses_non_objects(data):
    with pytest.raises(ValueError, match="not a JSON object"):
        parse_json_object(data)


def test_parse_json_object_refuses_invalid_json():
    with pytest.raises(ValueError):
        parse_json_object(b"{not json")


def test_parse_json_object_returns_the_dict():
    assert parse_json_object(b'{"a": 1}') == {"a": 1}
