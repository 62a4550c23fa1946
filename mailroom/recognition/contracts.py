"""The NATS contract with recognition services (schema version 1.0).

Requests go out on ``files.tabular_uploaded`` / ``files.img_uploaded``; acks and
results come back on ``files.tabular_parsed``. Each message carries a
``Nats-Msg-Id`` header built from the job id and attempt, so every hop can
dedupe on a stable key. JSON Schemas of these models are checked in under
``contracts/`` (``python -m mailroom.recognition.contracts --write``).
"""

from __future__ import annotations

import json
import sys
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION: Literal["1.0"] = "1.0"
RESULT_SCHEMA_VERSION: Literal["1.0"] = "1.0"
MSG_ID_HEADER = "Nats-Msg-Id"
#: Counters are stored as 32-bit integers.
MAX_COUNTER = 2**31 - 1

Pipeline = Literal["tabular", "image"]
ResponseStatus = Literal["processing", "done", "needs_check", "error"]


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
    bucket: str = Field(min_length=1, max_length=255)
    key: str = Field(min_length=1, max_length=1024)


class RecognitionRequest(_Contract):
    """Ask a recognition service to read one stored file."""

    schema_version: Literal["1.0"] = SCHEMA_VERSION
    job_id: uuid.UUID
    file_id: int
    pipeline: Pipeline
    file_type: str = Field(min_length=1, max_length=20)
    original_name: str = Field(min_length=1, max_length=255)
    s3: ObjectRef
    reply_deadline: datetime
    attempt: int = Field(ge=1)


class ServiceInfo(_Contract):
    name: str = Field(min_length=1, max_length=200)
    version: str = Field(min_length=1, max_length=100)


class ResponseMetrics(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    fields_total: int | None = Field(default=None, ge=0, le=MAX_COUNTER)
    fields_low_confidence: int | None = Field(default=None, ge=0, le=MAX_COUNTER)
    fields_unrecognized: int | None = Field(default=None, ge=0, le=MAX_COUNTER)


class ResponseError(_Contract):
    code: str = Field(min_length=1, max_length=100)
    message: str = Field(default="", max_length=4000)


class RecognitionResponse(_Contract):
    """An ack (``processing``) or a result (``done`` / ``needs_check`` / ``error``)."""

    schema_version: Literal["1.0"] = SCHEMA_VERSION
    job_id: uuid.UUID
    file_id: int
    status: ResponseStatus
    service: ServiceInfo
    result_s3: ObjectRef | None = None
    result_schema_version: str | None = Field(default=None, max_length=20)
    metrics: ResponseMetrics | None = None
    error: ResponseError | None = None

    @property
    def is_ack(self) -> bool:
        return self.status == "processing"


class ResultField(_Contract):
    value: str | int | float | bool | None = None
    confidence: float = Field(ge=0.0, le=1.0)


class RecognitionResult(_Contract):
    """The result file a service writes to the results bucket."""

    schema_version: Literal["1.0"] = RESULT_SCHEMA_VERSION
    job_id: uuid.UUID
    document_type: str = Field(min_length=1, max_length=100)
    fields: dict[str, ResultField] = Field(default_factory=dict)


#: The models whose JSON Schemas live in ``contracts/``, by file stem.
SCHEMAS: dict[str, type[BaseModel]] = {
    "recognition_request": RecognitionRequest,
    "recognition_response": RecognitionResponse,
    "recognition_result": RecognitionResult,
}

CONTRACTS_DIR = Path(__file__).resolve().parents[2] / "contracts"


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
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


if __name__ == "__main__" and "--write" in sys.argv:
    for path in write_schemas():
        print(path)
