"""The NATS contract with recognition services (schema version 1.1): the shapes of its messages.

Requests go out on ``files.tabular_uploaded`` / ``files.img_uploaded``; acks and
results come back on ``files.tabular_parsed``. Each message carries a
``Nats-Msg-Id`` header built from the job id and attempt, so every hop can
dedupe on a stable key. JSON Schemas of these models and the AsyncAPI document
(``asyncapi.py``) are checked in under ``contracts/``
(``python -m mailroom.recognition.contract --write``). What Mailroom does with
each message, and the error codes, are in the rule book, ``rules.py``.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION: Literal["1.1"] = "1.1"
RESULT_SCHEMA_VERSION: Literal["1.0"] = "1.0"
#: Versions Mailroom reads: any minor version of major 1 (``1.0``, ``1.7``), never ``2.x``.
SUPPORTED_VERSION_PATTERN = r"^1\.[0-9]+$"
MSG_ID_HEADER = "Nats-Msg-Id"
#: Counters are stored as 32-bit integers.
MAX_COUNTER = 2**31 - 1
#: The service recorded for an answer that names none.
UNKNOWN_SERVICE = "unknown"
#: The error code recorded for an ``error`` answer that gives none.
SERVICE_ERROR = "SERVICE_ERROR"

Pipeline = Literal["tabular", "image"]
ResponseStatus = Literal["processing", "done", "needs_check", "error"]

SchemaVersion = Annotated[
    str,
    Field(
        pattern=SUPPORTED_VERSION_PATTERN,
        max_length=20,
        description=(
            "Contract version of the sender, `MAJOR.MINOR`. Any `1.x` is read (a minor version "
            "only adds optional fields, which readers ignore); another major version is "
            "refused. Omitted: read like any `1.x`."
        ),
    ),
]
JobId = Annotated[
    uuid.UUID,
    Field(
        description=(
            "The recognition job: a UUID (string form). One job is one attempt at one file; "
            "a replay of the file is a new job with a new id."
        ),
    ),
]
FileId = Annotated[
    int,
    # NOTE: strict: "4182" is not converted; the schema says integer, and a service that
    # sends a string would have it refused by any other reader of the schema.
    Field(
        strict=True,
        description=(
            "Mailroom's stored file id: a JSON integer (a database id), not a UUID and not a "
            "string. An answer echoes the request's value; an answer whose `file_id` differs "
            "from its job's is rejected."
        ),
    ),
]


def request_msg_id(job_id: uuid.UUID | str, attempt: int) -> str:
    return f"{job_id}:{attempt}:request"


def ack_msg_id(job_id: uuid.UUID | str, attempt: int) -> str:
    return f"{job_id}:{attempt}:ack"


def result_msg_id(job_id: uuid.UUID | str, attempt: int) -> str:
    return f"{job_id}:{attempt}:result"


class _Contract(BaseModel):
    # Unknown keys are tolerated so a newer service can add fields without breaking us.
    model_config = ConfigDict(extra="ignore", frozen=True)


class ObjectRef(_Contract):
    """An object in the object store (S3 API)."""

    bucket: str = Field(min_length=1, max_length=255, description="Bucket name.")
    key: str = Field(min_length=1, max_length=1024, description="Object key in the bucket.")


class RecognitionRequest(_Contract):
    """Ask a recognition service to read one stored file.

    Sent by Mailroom on the request subject of its pipeline with the header
    ``Nats-Msg-Id: {job_id}:{attempt}:request``. The same request may arrive more
    than once (republished while unacked): a service answers it once per
    ``job_id`` + ``attempt``.
    """

    schema_version: SchemaVersion = SCHEMA_VERSION
    job_id: JobId
    file_id: FileId
    pipeline: Pipeline = Field(
        description="`tabular` (spreadsheets, CSV) or `image` (scans, photos, PDF pages)."
    )
    file_type: str = Field(
        min_length=1,
        max_length=20,
        description="The file's type as Mailroom detected it, lower case (`csv`, `xlsx`, `png`).",
    )
    original_name: str = Field(
        min_length=1, max_length=255, description="The attachment's file name in the mail."
    )
    s3: ObjectRef = Field(description="Where the file is: read it from here.")
    reply_deadline: datetime = Field(
        description=(
            "ISO 8601 time with offset. A job without a result by then is ended as `timeout` "
            "(by a watchdog every 30 s); a result after that changes nothing."
        )
    )
    attempt: int = Field(
        ge=1,
        description=(
            "Attempt number of this file's recognition, from 1. Part of every message id; "
            "a service dedupes on `job_id` + `attempt`."
        ),
    )


class ServiceInfo(_Contract):
    """The recognition service that answered: recorded on the job, Mailroom decides nothing on it."""

    name: str = Field(
        default=UNKNOWN_SERVICE,
        min_length=1,
        max_length=200,
        description="Service name, stable across versions.",
    )
    version: str = Field(
        default=UNKNOWN_SERVICE, min_length=1, max_length=100, description="Service version."
    )


class ResponseMetrics(BaseModel):
    """Counters of the result; other keys are kept as they are (service-defined)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    fields_total: int | None = Field(
        default=None, ge=0, le=MAX_COUNTER, description="Fields the service extracted."
    )
    fields_low_confidence: int | None = Field(
        default=None,
        ge=0,
        le=MAX_COUNTER,
        description="Fields whose confidence the service found low.",
    )
    fields_unrecognized: int | None = Field(
        default=None, ge=0, le=MAX_COUNTER, description="Fields found without a value."
    )


class ResponseError(_Contract):
    """Why a service could not recognize the file (``status: error``)."""

    code: str = Field(
        default=SERVICE_ERROR,
        min_length=1,
        max_length=100,
        description=(
            "Machine-readable code, upper snake case (see the error codes in `asyncapi.json`). "
            "Omitted: `SERVICE_ERROR`."
        ),
    )
    message: str = Field(
        default="",
        max_length=4000,
        description="For people: what went wrong. Never the file's content.",
    )
    permanent: bool | None = Field(
        default=None,
        strict=True,
        description=(
            "Since 1.1. `true`: a new attempt cannot help, the file ends ERROR at once; "
            "`false`: worth another attempt. Omitted: the code's class (`retryable` or "
            "`permanent`, listed in `asyncapi.json`); a code not listed is retryable."
        ),
    )


def _result_needs_its_object(schema: dict[str, Any]) -> None:
    # NOTE: the inbox enforces this after validation (inbox_messages.parse_response);
    # the schema says it so a service can check its answers with the schema alone.
    schema["allOf"] = [
        {
            "if": {
                "properties": {"status": {"enum": ["done", "needs_check"]}},
                "required": ["status"],
            },
            "then": {
                "required": ["result_s3"],
                "properties": {"result_s3": {"type": "object"}},
            },
        }
    ]


class RecognitionResponse(_Contract):
    """An ack (``processing``) or a result (``done`` / ``needs_check`` / ``error``).

    Sent by the service on the results subject with the header
    ``Nats-Msg-Id: {job_id}:{attempt}:ack`` or ``…:result``. Required: ``job_id``,
    ``file_id``, ``status``, and ``result_s3`` for ``done`` / ``needs_check``;
    everything else is optional.
    """

    model_config = ConfigDict(json_schema_extra=_result_needs_its_object)

    schema_version: SchemaVersion = SCHEMA_VERSION
    job_id: JobId
    file_id: FileId
    status: ResponseStatus = Field(
        description=(
            "`processing`: the ack, the service took the request. `done`: the result document "
            "is written. `needs_check`: written, but a person should check it. `error`: no "
            "document; see `error`."
        )
    )
    service: ServiceInfo = Field(
        default_factory=ServiceInfo,
        description="Who answered; recorded on the job. Omitted: recorded as `unknown`.",
    )
    result_s3: ObjectRef | None = Field(
        default=None,
        description=(
            "Where the result document is: required for `done` and `needs_check`, in the "
            "results bucket (`MAILROOM_STORAGE__RESULTS_BUCKET`)."
        ),
    )
    result_schema_version: str | None = Field(
        default=None,
        max_length=20,
        description="`schema_version` of the result document (recorded on the job).",
    )
    metrics: ResponseMetrics | None = Field(
        default=None, description="Counters of the result, merged into the job's metrics."
    )
    error: ResponseError | None = Field(
        default=None,
        description="For `error`: code and message. Omitted: code `SERVICE_ERROR`.",
    )

    @property
    def is_ack(self) -> bool:
        return self.status == "processing"


class ResultField(_Contract):
    """One extracted field."""

    value: str | int | float | bool | None = Field(
        default=None, description="The value read; `null` when the field was not found."
    )
    confidence: float = Field(
        ge=0.0,
        le=1.0,
        description=(
            "How sure the service is, 0 to 1. Below Mailroom's `confidence_threshold` the "
            "file needs a check."
        ),
    )


class RecognitionResult(_Contract):
    """The result document a service writes to the results bucket (``result_s3``).

    Required: ``job_id`` (Mailroom refuses a document naming another job) and
    ``document_type``; each field needs a ``confidence``.
    """

    schema_version: SchemaVersion = RESULT_SCHEMA_VERSION
    job_id: JobId
    document_type: str = Field(
        min_length=1,
        max_length=100,
        description=(
            "Kind of document (`invoice`, `generic`, …). It selects the required fields "
            "(Mailroom's `document_types` setting); an unknown type needs a check."
        ),
    )
    fields: dict[str, ResultField] = Field(
        default_factory=dict, description="Extracted fields by name."
    )


#: The models whose JSON Schemas live in ``contracts/``, by file stem.
SCHEMAS: dict[str, type[BaseModel]] = {
    "recognition_request": RecognitionRequest,
    "recognition_response": RecognitionResponse,
    "recognition_result": RecognitionResult,
}

CONTRACTS_DIR = Path(__file__).resolve().parents[3] / "contracts"


def render_schema(model: type[BaseModel]) -> str:
    return json.dumps(model.model_json_schema(), indent=2, sort_keys=True) + "\n"


def write_schemas(folder: Path = CONTRACTS_DIR) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, model in SCHEMAS.items():
        path = folder / f"{stem}.schema.json"
        path.write_text(render_schema(model))
        written.append(path)
    return written


def dump(model: BaseModel) -> bytes:
    """Wire form of a contract message."""
    return model.model_dump_json(exclude_none=True).encode()


def parse_json_object(data: bytes) -> dict[str, Any]:
    """The JSON object in ``data``, read as UTF-8 (RFC 8259) by pydantic's parser.

    Every side of the contract reads messages and results with this one function, so a
    service the conformance check passes is one the inbox accepts. About three times faster
    than ``json.loads`` on a result message, and stricter: a byte-order mark or UTF-16 (RFC
    8259 asks for UTF-8 without one) and a lone surrogate escape (no text column can keep it)
    make it not JSON.
    """
    value = pydantic_core.from_json(data)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value
