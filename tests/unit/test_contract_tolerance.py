"""The contract is tolerant where it is safe: extra fields, minor versions, optional extras.

What Mailroom requires is exactly what it uses (ARCHITECTURE.md, Recognition):
an answer needs ``job_id``, ``file_id`` and ``status`` (plus ``result_s3`` for
``done`` / ``needs_check``); a result document needs ``job_id``, ``document_type``
and a ``confidence`` per field. Everything else may be omitted, and unknown keys
are ignored, so a service on a newer minor version keeps working.
"""

from __future__ import annotations

import json
import uuid

import jsonschema
import pytest
from pydantic import ValidationError

from mailroom.errors import InvalidMessage
from mailroom.recognition.contract.models import (
    CONTRACTS_DIR,
    SCHEMAS,
    SERVICE_ERROR,
    UNKNOWN_SERVICE,
    RecognitionRequest,
    RecognitionResult,
)
from mailroom.recognition.inbox.messages import parse_response
from mailroom.recognition.mapping.run import Unusable, load_result

JOB_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def _answer(**changes):
    body = {"job_id": str(JOB_ID), "file_id": 7, "status": "processing"}
    body.update(changes)
    return body


def _document(**changes):
    body = {
        "job_id": str(JOB_ID),
        "document_type": "invoice",
        "fields": {"total": {"value": "12.50", "confidence": 0.9}},
    }
    body.update(changes)
    return body


def _request(**changes):
    body = {
        "job_id": str(JOB_ID),
        "file_id": 7,
        "pipeline": "tabular",
        "file_type": "csv",
        "original_name": "invoice.csv",
        "s3": {"bucket": "mailroom-incoming", "key": "attachments/ab/abc.csv"},
        "reply_deadline": "2030-01-01T00:00:00+00:00",
        "attempt": 1,
    }
    body.update(changes)
    return body


def _schema(stem):
    return json.loads((CONTRACTS_DIR / f"{stem}.schema.json").read_text())


# --- unknown extra fields ------------------------------------------------------------------


def test_an_answer_with_unknown_fields_at_every_level_is_read():
    answer = _answer(
        status="done",
        trace_id="abc",
        service={"name": "svc", "version": "2", "region": "eu"},
        result_s3={"bucket": "mailroom-results", "key": "r.json", "etag": "x"},
        error=None,
    )
    response = parse_response(json.dumps(answer).encode())
    assert response.status == "done"
    assert response.service.name == "svc"
    assert "trace_id" not in response.model_dump()


def test_a_result_document_with_unknown_fields_at_every_level_is_read():
    document = _document(
        language="de",
        fields={"total": {"value": "1", "confidence": 0.9, "bbox": [1, 2, 3, 4]}},
    )
    result = RecognitionResult.model_validate(document)
    assert result.fields["total"].confidence == 0.9
    assert "language" not in result.model_dump()


@pytest.mark.parametrize("stem", sorted(SCHEMAS))
def test_the_schemas_allow_unknown_fields(stem):
    # The published schemas must not forbid what Mailroom ignores.
    schema = _schema(stem)
    for node in [schema, *schema.get("$defs", {}).values()]:
        assert node.get("additionalProperties", True) is not False


# --- minor versions ------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.27"])
def test_a_minor_version_of_an_answer_is_accepted(version):
    response = parse_response(json.dumps(_answer(schema_version=version)).encode())
    assert response.schema_version == version


@pytest.mark.parametrize("version", ["1.0", "1.3"])
def test_a_minor_version_of_a_result_document_is_accepted(version):
    assert RecognitionResult.model_validate(_document(schema_version=version)).job_id == JOB_ID


def test_a_minor_version_of_a_request_is_accepted():
    assert RecognitionRequest.model_validate(_request(schema_version="1.4")).attempt == 1


@pytest.mark.parametrize("version", ["2.0", "2.1", "0.9", "10.0", "1", "1.0.1", "v1.0", ""])
def test_another_major_version_of_an_answer_is_rejected(version):
    with pytest.raises(InvalidMessage, match="schema_version"):
        parse_response(json.dumps(_answer(schema_version=version)).encode())


@pytest.mark.parametrize("model", [RecognitionResult, RecognitionRequest])
def test_another_major_version_of_a_document_or_request_is_rejected(model):
    body = _document() if model is RecognitionResult else _request()
    with pytest.raises(ValidationError):
        model.model_validate({**body, "schema_version": "2.0"})


async def test_mapping_refuses_a_result_document_of_another_major_version():
    class Store:
        def bucket(self, role):
            return "mailroom-results"

        async def size(self, bucket, key):
            return 100

        async def get(self, bucket, key):
            return json.dumps(_document(schema_version="2.0")).encode()

    loaded = await load_result(Store(), "mailroom-results", "r.json", job_id=JOB_ID, max_bytes=1000)
    assert isinstance(loaded, Unusable)
    assert loaded.code == "INVALID_RESULT"
    assert "schema_version" in loaded.message


async def test_mapping_reads_a_minor_version_with_unknown_fields():
    class Store:
        def bucket(self, role):
            return "mailroom-results"

        async def size(self, bucket, key):
            return 100

        async def get(self, bucket, key):
            return json.dumps(_document(schema_version="1.9", pages=2)).encode()

    loaded = await load_result(Store(), "mailroom-results", "r.json", job_id=JOB_ID, max_bytes=1000)
    assert isinstance(loaded, RecognitionResult)
    assert loaded.schema_version == "1.9"


@pytest.mark.parametrize(("version", "valid"), [("1.5", True), ("2.0", False)])
@pytest.mark.parametrize("stem", sorted(SCHEMAS))
def test_the_schemas_accept_minor_and_refuse_major_versions(stem, version, valid):
    example = {
        "recognition_request": _request,
        "recognition_response": _answer,
        "recognition_result": _document,
    }[stem](schema_version=version)
    validator = jsonschema.Draft202012Validator(_schema(stem))
    assert validator.is_valid(example) is valid


# --- required is what Mailroom uses ----------------------------------------------------------


def test_an_answer_needs_only_job_file_and_status():
    assert set(_schema("recognition_response")["required"]) == {"job_id", "file_id", "status"}
    response = parse_response(json.dumps(_answer()).encode())
    assert response.schema_version.startswith("1.")


def test_an_answer_without_service_is_recorded_as_unknown():
    # A third-party service that left out `service` had every result rejected before.
    result = _answer(status="done", result_s3={"bucket": "mailroom-results", "key": "r.json"})
    response = parse_response(json.dumps(result).encode())
    assert (response.service.name, response.service.version) == (UNKNOWN_SERVICE, UNKNOWN_SERVICE)


def test_a_service_without_version_is_accepted():
    response = parse_response(json.dumps(_answer(service={"name": "svc"})).encode())
    assert (response.service.name, response.service.version) == ("svc", UNKNOWN_SERVICE)


@pytest.mark.parametrize("error", [None, {}, {"message": "no code given"}])
def test_an_error_answer_without_code_gets_service_error(error):
    answer = _answer(status="error") if error is None else _answer(status="error", error=error)
    response = parse_response(json.dumps(answer).encode())
    code = response.error.code if response.error else SERVICE_ERROR
    assert code == SERVICE_ERROR


@pytest.mark.parametrize("status", ["done", "needs_check"])
def test_a_result_without_its_object_is_refused_by_inbox_and_schema(status):
    answer = _answer(status=status)
    with pytest.raises(InvalidMessage, match="result_s3"):
        parse_response(json.dumps(answer).encode())
    validator = jsonschema.Draft202012Validator(_schema("recognition_response"))
    assert not validator.is_valid(answer)
    assert not validator.is_valid({**answer, "result_s3": None})
    assert validator.is_valid({**answer, "result_s3": {"bucket": "b", "key": "k"}})


@pytest.mark.parametrize("status", ["processing", "error"])
def test_acks_and_errors_need_no_result_object_in_the_schema(status):
    validator = jsonschema.Draft202012Validator(_schema("recognition_response"))
    assert validator.is_valid(_answer(status=status))


@pytest.mark.parametrize("missing", ["job_id", "file_id", "status"])
def test_an_answer_missing_a_required_field_is_rejected(missing):
    answer = {k: v for k, v in _answer().items() if k != missing}
    with pytest.raises(InvalidMessage, match=missing):
        parse_response(json.dumps(answer).encode())


def test_a_file_id_must_be_an_integer():
    with pytest.raises(InvalidMessage, match="file_id"):
        parse_response(json.dumps(_answer(file_id=str(uuid.uuid4()))).encode())


def test_a_result_document_needs_job_document_type_and_confidences():
    schema = _schema("recognition_result")
    assert set(schema["required"]) == {"job_id", "document_type"}
    assert schema["$defs"]["ResultField"]["required"] == ["confidence"]
    assert RecognitionResult.model_validate(_document(fields={})).fields == {}
    assert (
        RecognitionResult.model_validate(_document(fields={"total": {"confidence": 0.2}}))
        .fields["total"]
        .value
        is None
    )
    with pytest.raises(ValidationError):
        RecognitionResult.model_validate(_document(fields={"total": {"value": "1"}}))
