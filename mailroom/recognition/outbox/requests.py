"""The wire form of an outbox pass's requests: each checked by the contract, written once.

Each claimed job's request is validated by ``RecognitionRequest`` (a job the contract
rejects fails ``INVALID_REQUEST``, outbox.py), then written from the validated values
into the contract's JSON by a template instead of by the model's serializer: building,
serializing and wrapping a model per job cost the publisher more than its SQL did
(bench/outbox.py). The template writes the bytes ``contracts.dump`` writes, field for
field in the model's order (tests/unit/test_outbox_requests.py holds it to that, awkward
names included); a field added to the model fails that test until it is written here.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pydantic_core

from mailroom.recognition.contract.models import SCHEMA_VERSION, RecognitionRequest
from mailroom.recognition.outbox.sql import ClaimedJob

# The model's own validator, called without BaseModel.__init__'s keyword handling.
_validate = RecognitionRequest.__pydantic_validator__.validate_python
# JSON string escaping as pydantic's serializer does it: UTF-8 kept, controls escaped.
_string = json.encoder.encode_basestring

#: The fields the template writes, in the model's order.
FIELDS = (
    "schema_version",
    "job_id",
    "file_id",
    "pipeline",
    "file_type",
    "original_name",
    "s3",
    "reply_deadline",
    "attempt",
)


class RequestWriter:
    """Request bodies for one pass; deadlines are written once each (a pass shares one)."""

    def __init__(self) -> None:
        self._deadlines: dict[datetime, str] = {}
        self._head = '{"schema_version":' + _string(SCHEMA_VERSION) + ',"job_id":"'

    def body(self, job: ClaimedJob, job_key: str, deadline: datetime | None) -> bytes:
        """The request's JSON; ``job_key`` is ``str(job.id)``. Raises ``ValidationError``."""
        request: Any = _validate(
            {
                "job_id": job.id,
                "file_id": job.file_id,
                "pipeline": job.pipeline,
                "file_type": job.file_type,
                "original_name": job.original_name,
                "s3": {"bucket": job.bucket, "key": job.key},
                "reply_deadline": deadline,
                "attempt": job.attempt,
            }
        )
        written = self._deadlines.get(request.reply_deadline)
        if written is None:
            written = pydantic_core.to_json(request.reply_deadline).decode()
            self._deadlines[request.reply_deadline] = written
        s3 = request.s3
        return (
            f'{self._head}{job_key}","file_id":{request.file_id:d},'
            f'"pipeline":{_string(request.pipeline)},"file_type":{_string(request.file_type)},'
            f'"original_name":{_string(request.original_name)},'
            f'"s3":{{"bucket":{_string(s3.bucket)},"key":{_string(s3.key)}}},'
            f'"reply_deadline":{written},"attempt":{request.attempt:d}}}'
        ).encode()
