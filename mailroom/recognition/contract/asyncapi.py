"""The AsyncAPI 3.0 document of the recognition contract, built from the contract's models.

``contracts/asyncapi.json`` is this module's output (``make contracts``); a unit
test fails when it drifts. It describes Mailroom: it sends requests and
receives acks and results. Subjects, queue group and timings are the settings'
defaults, never the environment's values.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from mailroom.recognition.contract.models import (
    CONTRACTS_DIR,
    MSG_ID_HEADER,
    RESULT_SCHEMA_VERSION,
    ObjectRef,
    RecognitionRequest,
    RecognitionResponse,
    RecognitionResult,
    ResponseError,
    ResponseMetrics,
    ServiceInfo,
    ack_msg_id,
    request_msg_id,
    result_msg_id,
)
from mailroom.recognition.contract.rules import (
    CONTRACT_VERSION,
    MAILROOM_ERROR_CODES,
    SERVICE_ERROR_CODES,
    VERSION_POLICY,
    ErrorCode,
)
from mailroom.settings import NatsSettings, RecognitionSettings, StorageSettings

ASYNCAPI_FILE = "asyncapi.json"
_UUID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"

_EXAMPLE_JOB = uuid.UUID("0b7e4f36-5d0c-4c52-9a55-6f1d8e2a4b10")
_EXAMPLE_SERVICE = ServiceInfo(name="acme-recognizer", version="2.3.1")
_EXAMPLE_RESULT_REF = ObjectRef(bucket="mailroom-results", key=f"results/{_EXAMPLE_JOB}.1.json")


def _example_messages() -> dict[str, list[tuple[str, str, BaseModel]]]:
    """Examples by message: (name, summary, payload); the msg id comes from the message kind."""
    request = RecognitionRequest(
        job_id=_EXAMPLE_JOB,
        file_id=4182,
        pipeline="tabular",
        file_type="csv",
        original_name="invoice-2031.csv",
        s3=ObjectRef(bucket="mailroom-incoming", key="attachments/3f/3f9a0c.csv"),
        reply_deadline=datetime(2030, 1, 1, 12, 5, tzinfo=UTC),
        attempt=1,
    )
    answer = {"job_id": _EXAMPLE_JOB, "file_id": 4182, "service": _EXAMPLE_SERVICE}
    metrics = ResponseMetrics(fields_total=2, fields_low_confidence=0, fields_unrecognized=0)
    return {
        "recognitionRequest": [("request", "Read one CSV attachment.", request)],
        "recognitionAck": [
            (
                "ack",
                "The service took the request.",
                RecognitionResponse(**answer, status="processing"),
            )
        ],
        "recognitionResult": [
            (
                "done",
                "The result document is written.",
                RecognitionResponse(
                    **answer,
                    status="done",
                    result_s3=_EXAMPLE_RESULT_REF,
                    result_schema_version=RESULT_SCHEMA_VERSION,
                    metrics=metrics,
                ),
            ),
            (
                "error",
                "The file could not be read.",
                RecognitionResponse(
                    **answer,
                    status="error",
                    error=ResponseError(code="UNREADABLE", message="not a CSV file"),
                ),
            ),
        ],
    }


def example_result_document() -> RecognitionResult:
    """The result document of the ``done`` example, as written to ``result_s3``."""
    return RecognitionResult(
        job_id=_EXAMPLE_JOB,
        document_type="invoice",
        fields={
            "invoice_number": {"value": "INV-2031", "confidence": 0.98},
            "total": {"value": 1250.5, "confidence": 0.91},
        },
    )


def msg_id_pattern(kind: str) -> str:
    """The ``Nats-Msg-Id`` of one message kind (``request``, ``ack``, ``result``) as a regex."""
    return f"^{_UUID}:[1-9][0-9]*:{kind}$"


_MSG_ID_BUILDERS = {"request": request_msg_id, "ack": ack_msg_id, "result": result_msg_id}


def _headers(kind: str, *, required: bool) -> dict[str, Any]:
    described = (
        f"`{{job_id}}:{{attempt}}:{kind}`: the same for every copy of this message, so "
        "JetStream's duplicate window and the receiver drop repeats."
    )
    if not required:
        described += " Send it; when it is missing Mailroom derives it and logs a warning."
    return {
        "type": "object",
        "properties": {
            MSG_ID_HEADER: {
                "type": "string",
                "pattern": msg_id_pattern(kind),
                "maxLength": 200,
                "description": described,
            }
        },
        **({"required": [MSG_ID_HEADER]} if required else {}),
    }


def _message(
    key: str, kind: str, payload: str, title: str, description: str, *, header_required: bool
) -> dict[str, Any]:
    examples = []
    for name, summary, model in _example_messages()[key]:
        job_id, attempt = model.job_id, getattr(model, "attempt", 1)  # type: ignore[attr-defined]
        examples.append(
            {
                "name": name,
                "summary": summary,
                "headers": {MSG_ID_HEADER: _MSG_ID_BUILDERS[kind](job_id, attempt)},
                "payload": model.model_dump(mode="json", exclude_none=True),
            }
        )
    return {
        "name": key,
        "title": title,
        "description": description,
        "contentType": "application/json",
        "headers": _headers(kind, required=header_required),
        "payload": {"$ref": f"#/components/schemas/{payload}"},
        "correlationId": {
            "description": "The job: every message about one job carries its id.",
            "location": "$message.payload#/job_id",
        },
        "examples": examples,
    }


def _code_list(codes: tuple[ErrorCode, ...]) -> str:
    return "\n".join(f"- `{e.code}` ({e.error_class}): {e.meaning}" for e in codes)


def _code_table(codes: tuple[ErrorCode, ...]) -> dict[str, dict[str, str]]:
    return {e.code: {"class": e.error_class, "meaning": e.meaning} for e in codes}


def build_asyncapi() -> dict[str, Any]:
    """The AsyncAPI 3.0 document, from the models and the settings' defaults."""
    nats, recognition, storage = NatsSettings(), RecognitionSettings(), StorageSettings()
    _, top = models_json_schema(
        [(m, "validation") for m in (RecognitionRequest, RecognitionResponse, RecognitionResult)],
        ref_template="#/components/schemas/{model}",
    )
    prefix = {
        "prefix": {
            "description": "`MAILROOM_NATS__SUBJECT_PREFIX` (empty by default), put before "
            "every subject, e.g. `dev.`.",
            "default": nats.subject_prefix,
            "examples": ["", "dev."],
        }
    }
    group = nats.recognizer_queue_group

    def request_channel(subject: str, pipeline: str) -> dict[str, Any]:
        return {
            "address": f"{{prefix}}{subject}",
            "title": f"{pipeline.capitalize()} requests",
            "description": (
                f"Mailroom publishes one request per `{pipeline}` file. Subscribe in a queue "
                f"group (the reference recognizer uses `{group}`) so one replica takes each."
            ),
            "parameters": prefix,
            "messages": {
                "recognitionRequest": {"$ref": "#/components/messages/recognitionRequest"}
            },
        }

    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Mailroom recognition contract",
            "version": CONTRACT_VERSION,
            "description": (
                "Mailroom asks recognition services to read stored files and takes their "
                "answers. A service acks each request (`processing`), writes its result "
                f"document to the results bucket (`{storage.results_bucket}` by default) and "
                "publishes the result. Services are idempotent by `job_id` + `attempt`. "
                f"An unacked request is republished after {recognition.ack_timeout_s:g} s "
                f"(at most {recognition.max_republish} times, then `NO_ACK`); a job without a "
                f"result at `reply_deadline` (now + {recognition.reply_deadline_s:g} s) ends as "
                "`TIMEOUT`. With JetStream the subjects are captured by the stream "
                f"`{nats.stream_name}` (duplicate window {nats.duplicate_window_s} s on "
                f"`{MSG_ID_HEADER}`). Readers ignore unknown fields. "
                + VERSION_POLICY
                + ' See the documentation, "Writing a recognition service".'
            ),
        },
        "defaultContentType": "application/json",
        "servers": {
            "development": {
                "host": nats.url.removeprefix("nats://"),
                "protocol": "nats",
                "description": "The dev stack's NATS (`MAILROOM_NATS__URL`).",
            }
        },
        "channels": {
            "tabularRequests": request_channel(nats.tabular_subject, "tabular"),
            "imageRequests": request_channel(nats.image_subject, "image"),
            "answers": {
                "address": f"{{prefix}}{nats.results_subject}",
                "title": "Acks and results",
                "description": (
                    "Acks and results of both pipelines. Where a JetStream stream captures "
                    f"this subject (`{nats.stream_name}`, unless Mailroom runs on core NATS), "
                    "publish every answer with JetStream (`js.publish`), count it as sent only "
                    "once the stream's PubAck came back, and on a timeout or no responders "
                    f"publish it again under the same `{MSG_ID_HEADER}` until it does: a core "
                    "publish is at most once, and while the stream elects a leader the server "
                    "drops what it cannot store without an error to anyone, so a lost result "
                    "would end its job as `TIMEOUT`."
                ),
                "parameters": prefix,
                "messages": {
                    "recognitionAck": {"$ref": "#/components/messages/recognitionAck"},
                    "recognitionResult": {"$ref": "#/components/messages/recognitionResult"},
                },
            },
        },
        "operations": {
            "sendTabularRequest": {
                "action": "send",
                "channel": {"$ref": "#/channels/tabularRequests"},
                "summary": "Ask for one tabular file (CSV, spreadsheets) to be read.",
            },
            "sendImageRequest": {
                "action": "send",
                "channel": {"$ref": "#/channels/imageRequests"},
                "summary": "Ask for one image file (scans, photos) to be read.",
            },
            "receiveAnswers": {
                "action": "receive",
                "channel": {"$ref": "#/channels/answers"},
                "summary": "Apply acks and results to their jobs.",
                "description": (
                    f"With JetStream the durable pull consumer `{nats.inbox_durable}` reads the "
                    f"stream; without it the queue group `{nats.inbox_queue_group}`."
                ),
                "bindings": {"nats": {"queue": nats.inbox_queue_group, "bindingVersion": "0.1.0"}},
            },
        },
        "components": {
            "schemas": top["$defs"],
            "messages": {
                "recognitionRequest": _message(
                    "recognitionRequest",
                    "request",
                    "RecognitionRequest",
                    "Recognition request",
                    "Read the file at `s3` and answer on the answers subject.",
                    header_required=True,
                ),
                "recognitionAck": _message(
                    "recognitionAck",
                    "ack",
                    "RecognitionResponse",
                    "Ack",
                    "Sent first, as soon as the service takes the request (`status: processing`)."
                    " A lost ack never blocks a result.",
                    header_required=False,
                ),
                "recognitionResult": _message(
                    "recognitionResult",
                    "result",
                    "RecognitionResponse",
                    "Result",
                    "`done` / `needs_check` after the result document is written to "
                    "`result_s3`, or `error` with a code. Each code is `retryable` (re-sent as "
                    "a new attempt while `automatic_attempts` allows) or `permanent` (never "
                    "re-sent); `error.permanent` overrides the code's class, and a code not "
                    "listed is retryable. Codes a service sends (upper snake case):\n\n"
                    + _code_list(SERVICE_ERROR_CODES)
                    + "\n\nCodes Mailroom sets on a job itself:\n\n"
                    + _code_list(MAILROOM_ERROR_CODES),
                    header_required=False,
                ),
            },
        },
        "x-error-codes": {
            "service": _code_table(SERVICE_ERROR_CODES),
            "mailroom": _code_table(MAILROOM_ERROR_CODES),
        },
        "x-result-document": {
            "schema": {"$ref": "#/components/schemas/RecognitionResult"},
            "example": example_result_document().model_dump(mode="json"),
        },
    }


def render_asyncapi() -> str:
    return json.dumps(build_asyncapi(), indent=2) + "\n"


def write_asyncapi(folder: Path = CONTRACTS_DIR) -> Path:
    path = folder / ASYNCAPI_FILE
    path.write_text(render_asyncapi())
    return path
