"""The AsyncAPI document: generated from the models, complete, and its examples are the contract."""

from __future__ import annotations

import json
import uuid

import jsonschema
import pytest

from mailroom.errors import ExtractionError
from mailroom.recognition import finality
from mailroom.recognition.contract.asyncapi import (
    ASYNCAPI_FILE,
    build_asyncapi,
    example_result_document,
    msg_id_pattern,
    render_asyncapi,
)
from mailroom.recognition.contract.models import (
    CONTRACTS_DIR,
    MSG_ID_HEADER,
    RecognitionRequest,
    RecognitionResponse,
    RecognitionResult,
    ack_msg_id,
    request_msg_id,
    result_msg_id,
)
from mailroom.recognition.contract.rules import MAILROOM_ERROR_CODES, SERVICE_ERROR_CODES
from mailroom.recognition.inbox import attempts as inbox_attempts
from mailroom.recognition.mapping import run as mapping
from mailroom.service.answering import TRANSIENT_CODES
from mailroom.settings import NatsSettings

REGENERATE = "uv run python -m mailroom.recognition.contract --write"


@pytest.fixture(scope="module")
def document():
    return build_asyncapi()


def _resolve(document, ref):
    node = document
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def _registry(document):
    # Let jsonschema resolve ``#/components/schemas/...`` inside the whole document.
    return {**document, "$schema": "https://json-schema.org/draft/2020-12/schema"}


def _validator(document, schema_name):
    schema = {**_registry(document), "$ref": f"#/components/schemas/{schema_name}"}
    return jsonschema.Draft202012Validator(schema)


def test_checked_in_asyncapi_matches_the_models():
    path = CONTRACTS_DIR / ASYNCAPI_FILE
    assert path.exists(), f"contracts/{ASYNCAPI_FILE} is missing; run `{REGENERATE}`"
    assert path.read_text() == render_asyncapi(), (
        f"contracts/{ASYNCAPI_FILE} is out of date with mailroom/recognition/; "
        f"run `{REGENERATE}` and commit the result"
    )


def test_it_is_asyncapi_3_with_the_subjects_as_channels(document):
    nats = NatsSettings()
    assert document["asyncapi"] == "3.0.0"
    addresses = {name: channel["address"] for name, channel in document["channels"].items()}
    assert addresses == {
        "tabularRequests": "{prefix}" + nats.tabular_subject,
        "imageRequests": "{prefix}" + nats.image_subject,
        "answers": "{prefix}" + nats.results_subject,
    }
    assert nats.tabular_subject == "files.tabular_uploaded"
    assert nats.image_subject == "files.img_uploaded"
    assert nats.results_subject == "files.tabular_parsed"
    for channel in document["channels"].values():
        assert "prefix" in channel["parameters"]
        for ref in channel["messages"].values():
            _resolve(document, ref["$ref"])
    for operation in document["operations"].values():
        _resolve(document, operation["channel"]["$ref"])
    receive = document["operations"]["receiveAnswers"]
    assert receive["bindings"]["nats"]["queue"] == nats.inbox_queue_group


def test_every_field_of_every_model_has_a_type_and_a_description(document):
    schemas = document["components"]["schemas"]
    assert {"RecognitionRequest", "RecognitionResponse", "RecognitionResult"} <= set(schemas)
    for name, schema in schemas.items():
        assert schema.get("description"), name
        for field, prop in schema.get("properties", {}).items():
            assert prop.get("description"), f"{name}.{field} has no description"
            typed = "type" in prop or "$ref" in prop or "anyOf" in prop
            assert typed, f"{name}.{field} has no type"


def test_ids_say_what_they_are(document):
    schemas = document["components"]["schemas"]
    for name in ("RecognitionRequest", "RecognitionResponse"):
        file_id = schemas[name]["properties"]["file_id"]
        assert file_id["type"] == "integer"
        assert "integer" in file_id["description"]
        job_id = schemas[name]["properties"]["job_id"]
        assert (job_id["type"], job_id["format"]) == ("string", "uuid")
        assert "UUID" in job_id["description"]


@pytest.mark.parametrize(
    ("message", "kind", "build"),
    [
        ("recognitionRequest", "request", request_msg_id),
        ("recognitionAck", "ack", ack_msg_id),
        ("recognitionResult", "result", result_msg_id),
    ],
)
def test_the_msg_id_header_is_described_by_its_format(document, message, kind, build):
    headers = document["components"]["messages"][message]["headers"]
    header = headers["properties"][MSG_ID_HEADER]
    assert header["pattern"] == msg_id_pattern(kind)
    assert f"{{job_id}}:{{attempt}}:{kind}" in header["description"]
    validator = jsonschema.Draft202012Validator(headers)
    assert validator.is_valid({MSG_ID_HEADER: build(uuid.uuid4(), 12)})
    assert not validator.is_valid({MSG_ID_HEADER: f"{uuid.uuid4()}:1:other"})
    # Mailroom always sends it; on answers it is derived (with a warning) when missing.
    assert (MSG_ID_HEADER in headers.get("required", [])) is (kind == "request")


def test_every_message_has_examples_that_are_the_contract(document):
    models = {
        "RecognitionRequest": RecognitionRequest,
        "RecognitionResponse": RecognitionResponse,
    }
    for name, message in document["components"]["messages"].items():
        schema_name = message["payload"]["$ref"].rsplit("/", 1)[1]
        validator = _validator(document, schema_name)
        header_validator = jsonschema.Draft202012Validator(message["headers"])
        assert message["examples"], name
        for example in message["examples"]:
            validator.validate(example["payload"])
            header_validator.validate(example["headers"])
            models[schema_name].model_validate(example["payload"])
    statuses = [
        e["payload"]["status"]
        for e in document["components"]["messages"]["recognitionResult"]["examples"]
    ]
    assert {"done", "error"} <= set(statuses)


def test_the_result_document_example_is_the_contract(document):
    example = document["x-result-document"]["example"]
    _validator(document, "RecognitionResult").validate(example)
    assert RecognitionResult.model_validate(example) == example_result_document()


def test_the_error_codes_are_the_rule_books_and_the_ones_the_code_uses(document):
    for who, codes in (("service", SERVICE_ERROR_CODES), ("mailroom", MAILROOM_ERROR_CODES)):
        assert document["x-error-codes"][who] == {
            e.code: {"class": e.error_class, "meaning": e.meaning} for e in codes
        }
    mailroom_codes = {
        mapping.INVALID_RESULT,
        mapping.FOREIGN_BUCKET,
        mapping.RESULT_TOO_LARGE,
        mapping.MAPPING_ATTEMPTS_EXHAUSTED,
        finality.NO_ACK,
        inbox_attempts.INBOX_ATTEMPTS_EXHAUSTED,
        "TIMEOUT",
        "INVALID_REQUEST",
    }
    assert {e.code for e in MAILROOM_ERROR_CODES} == mailroom_codes
    extraction = {cls.code for cls in [ExtractionError, *ExtractionError.__subclasses__()]}
    assert extraction | TRANSIENT_CODES <= {e.code for e in SERVICE_ERROR_CODES}
    description = document["components"]["messages"]["recognitionResult"]["description"]
    for e in [*SERVICE_ERROR_CODES, *MAILROOM_ERROR_CODES]:
        assert f"`{e.code}` ({e.error_class})" in description


def test_the_document_is_plain_json():
    assert json.loads(render_asyncapi()) == build_asyncapi()
