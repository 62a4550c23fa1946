"""The outbox's request bodies and core publish, without servers."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import nats.errors
import pytest
from pydantic import ValidationError

from mailroom.adapters.nats import OutgoingMessage, PublishAck
from mailroom.adapters.nats.publisher import publish_core
from mailroom.errors import NatsUnavailable
from mailroom.recognition.contract.models import RecognitionRequest, dump, parse_json_object
from mailroom.recognition.outbox.requests import FIELDS, RequestWriter
from mailroom.recognition.outbox.sql import ClaimedJob

AWKWARD_NAMES = [
    "plain.csv",
    'quote " and backslash \\ and slash /.csv',
    "controls \x00 \x01 \x1f \x7f \b \f \n \r \t.csv",
    "utf-8 é 日本語 😀 \u2028 \u2029.png",
    '</script><!-- {"json": [1]} -->.xlsx',
]
DEADLINES = [
    datetime(2026, 12, 1, 13, 5, 7, 123456, tzinfo=UTC),
    datetime(2026, 12, 1, 13, 5, 7, tzinfo=UTC),
    datetime(2026, 12, 1, 15, 5, 7, 5, tzinfo=timezone(timedelta(hours=2))),
]


def _job(name: str, **changes: object) -> ClaimedJob:
    values: dict[str, object] = {
        "id": uuid.uuid4(),
        "file_id": 42,
        "pipeline": "image",
        "status": "queued",
        "attempt": 3,
        "reply_deadline": None,
        "request_subject": None,
        "republish_count": 0,
        "original_name": name,
        "file_type": "csv",
        "bucket": "mailroom-incoming",
        "key": f"2026/12/01/{name}",
    }
    values.update(changes)
    return ClaimedJob(**values)  # type: ignore[arg-type]


def _model_dump(job: ClaimedJob, deadline: datetime) -> bytes:
    request = RecognitionRequest(
        job_id=job.id,
        file_id=job.file_id,
        pipeline=job.pipeline,  # type: ignore[arg-type]
        file_type=job.file_type,  # type: ignore[arg-type]
        original_name=job.original_name,  # type: ignore[arg-type]
        s3={"bucket": job.bucket, "key": job.key},  # type: ignore[arg-type]
        reply_deadline=deadline,
        attempt=job.attempt,
    )
    return dump(request)


@pytest.mark.parametrize("deadline", DEADLINES)
@pytest.mark.parametrize("name", AWKWARD_NAMES)
def test_the_template_writes_the_bytes_the_contract_model_writes(name, deadline):
    job = _job(name)
    body = RequestWriter().body(job, str(job.id), deadline)
    assert body == _model_dump(job, deadline)
    assert RecognitionRequest.model_validate(parse_json_object(body)).original_name == name


def test_the_template_writes_every_field_of_the_model_in_its_order():
    assert tuple(RecognitionRequest.model_fields) == FIELDS


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"bucket": None, "key": None}, "s3"),
        ({"original_name": ""}, "original_name"),
        ({"file_type": "x" * 21}, "file_type"),
        ({"attempt": 0}, "attempt"),
    ],
)
def test_a_job_the_contract_rejects_raises_its_validation_error(changes, field):
    job = _job("a.csv", **changes)
    with pytest.raises(ValidationError) as caught:
        RequestWriter().body(job, str(job.id), DEADLINES[0])
    assert caught.value.errors()[0]["loc"][0] == field


class _Connection:
    """Enough of a nats-py connection for ``publish_core``: it drops at one message."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at
        self.sent: list[tuple[str, bytes, dict[str, str]]] = []

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> None:
        if len(self.sent) == self.fail_at:
            raise nats.errors.ConnectionClosedError
        self.sent.append((subject, payload, headers))

    async def flush(self, timeout: float) -> None:
        return None


async def test_core_publish_acks_a_whole_batch_with_each_msg_id_as_its_header():
    connection = _Connection(fail_at=-1)
    messages = [OutgoingMessage("s", b"{}", f"j{n}:1:request") for n in range(3)]
    results = await publish_core(connection, messages, timeout_s=1.0)  # type: ignore[arg-type]
    assert results == [PublishAck(m.msg_id) for m in messages]
    assert [headers["Nats-Msg-Id"] for _, _, headers in connection.sent] == [
        m.msg_id for m in messages
    ]


async def test_core_publish_error_names_its_message_and_fails_the_rest_of_the_batch():
    connection = _Connection(fail_at=1)
    messages = [OutgoingMessage("s", b"{}", f"j{n}:1:request") for n in range(4)]
    results = await publish_core(connection, messages, timeout_s=1.0)  # type: ignore[arg-type]
    assert results[0] == PublishAck("j0:1:request")
    errors = results[1:]
    assert all(isinstance(error, NatsUnavailable) for error in errors)
    assert "publish j1:1:request" in str(errors[0])
