"""Recognition pieces without servers: the fake publisher, parsing, judging, error translation."""

from __future__ import annotations

import json
import uuid

import nats.errors
import pytest

from bridges.nats import NatsBridge
from mailroom.adapters.nats import IncomingMessage, InMemoryPublisher, NatsClient, OutgoingMessage
from mailroom.adapters.nats.translate import translate_errors
from mailroom.errors import InvalidMessage, NatsPublishFailed, NatsUnavailable
from mailroom.recognition.contract.models import RecognitionResult
from mailroom.recognition.finality import short_repr
from mailroom.recognition.inbox.messages import parse_response
from mailroom.recognition.mapping.run import judge
from mailroom.recognition.outbox.relay import request_subject
from mailroom.settings import NatsSettings, RecognitionSettings, Settings


def _message(n: int) -> OutgoingMessage:
    return OutgoingMessage(subject="s", data=b"{}", msg_id=f"j{n}:1:request")


async def test_fake_publisher_records_dedupes_and_fails_on_request():
    publisher = InMemoryPublisher(fail_at=3)
    first = await publisher.publish_batch([_message(1), _message(2), _message(1)])
    assert [r.duplicate for r in first] == [False, False, True]
    second = await publisher.publish_batch([_message(3), _message(4)])
    assert all(isinstance(r, NatsPublishFailed) for r in second)
    assert len(publisher.published) == 3


async def test_client_that_never_connected_reports_unavailable():
    client = NatsClient(NatsSettings())
    assert not client.is_connected
    with pytest.raises(NatsUnavailable):
        await client.publish(_message(1))


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (nats.errors.TimeoutError(), NatsPublishFailed),
        (TimeoutError(), NatsPublishFailed),
        (nats.errors.ConnectionClosedError(), NatsUnavailable),
        (ConnectionRefusedError(), NatsUnavailable),
        (nats.errors.MaxPayloadError(), NatsPublishFailed),
    ],
)
def test_vendor_errors_are_translated_with_their_cause(error, expected):
    with pytest.raises(expected) as caught, translate_errors("publish"):
        raise error
    assert caught.value.__cause__ is error


def test_request_subject_follows_the_pipeline_and_prefix():
    settings = NatsSettings(subject_prefix="dev.")
    assert request_subject(settings, "tabular") == "dev.files.tabular_uploaded"
    assert request_subject(settings, "image") == "dev.files.img_uploaded"


def _response(**changes):
    body = {
        "schema_version": "1.0",
        "job_id": str(uuid.uuid4()),
        "file_id": 1,
        "status": "processing",
        "service": {"name": "r", "version": "1"},
        "unknown_key": "tolerated",
    }
    body.update(changes)
    return json.dumps(body).encode()


def test_parse_response_accepts_the_contract_and_rejects_the_rest():
    assert parse_response(_response()).is_ack
    for bad in (b"", b"nul", b'"text"', _response(status="finished"), _response(file_id="one")):
        with pytest.raises(InvalidMessage):
            parse_response(bad)
    with pytest.raises(InvalidMessage) as caught:
        parse_response(_response(status="done"))
    assert "result_s3" in caught.value.args[0]


def test_short_repr_escapes_and_truncates():
    assert short_repr("a\nb") == "'a\\nb'"
    assert len(short_repr("x" * 1000)) == 80


def _result(document_type="invoice", **fields):
    return RecognitionResult(
        job_id=uuid.uuid4(),
        document_type=document_type,
        fields={name: {"value": v, "confidence": c} for name, (v, c) in fields.items()},
    )


def test_judge_checks_required_fields_confidence_and_document_type():
    settings = RecognitionSettings()
    ok = judge(
        _result(invoice_number=("1", 0.9), total=(5, 0.99)),
        service_status="done",
        settings=settings,
    )
    assert (ok.file_status, ok.error_class, ok.document["status"]) == ("RECOGNIZED", None, "ok")

    # A file that needs a check has no error class: it waits for a person, never re-sent.
    missing = judge(_result(invoice_number=("", 0.9)), service_status="done", settings=settings)
    assert (missing.file_status, missing.error_class) == ("NEEDS_CHECK", None)
    assert missing.document["missing_fields"] == ["invoice_number", "total"]

    low = judge(_result("generic", title=("x", 0.5)), service_status="done", settings=settings)
    assert low.error_class is None and low.document["low_confidence_fields"] == ["title"]

    unknown = judge(_result("recipe"), service_status="done", settings=settings)
    assert (unknown.file_status, unknown.error_class) == ("NEEDS_CHECK", None)

    asked = judge(_result("generic"), service_status="needs_check", settings=settings)
    assert (asked.file_status, asked.error_class) == ("NEEDS_CHECK", None)


def _incoming(name: str, acked: list[str], size: int = 2) -> IncomingMessage:
    async def ack() -> None:
        acked.append(name)

    return IncomingMessage(subject=name, data=b"x" * size, headers={}, ack=ack, nak=ack)


def _bridge(send, **nats) -> NatsBridge:
    settings = Settings(
        nats=NatsSettings(**nats), recognition=RecognitionSettings(max_message_bytes=10)
    )
    return NatsBridge(NatsClient(settings.nats), send, settings=settings, max_batch_bytes=6)


async def test_bridge_acks_only_the_batches_it_enqueued_and_drops_oversize():
    acked: list[str] = []
    sent: list[list[str]] = []

    def send(items):
        if any(item["subject"] == "c" for item in items):
            raise ConnectionError("broker down")
        sent.append([item["subject"] for item in items])

    bridge = _bridge(send, bridge_fetch_batch=2)
    names = ["a", "big", "b", "c", "d"]
    sizes = {"big": 11}

    complete = await bridge.forward([_incoming(n, acked, sizes.get(n, 2)) for n in names])

    assert not complete
    assert sent == [["a", "b"]]
    assert acked == ["big", "a", "b"], "c and d stay unacked for redelivery"
    assert (bridge.forwarded, bridge.dropped, bridge.batches) == (2, 1, 1)


async def test_bridge_batches_are_bounded_by_bytes_and_a_large_message_goes_alone():
    acked: list[str] = []
    sent: list[list[str]] = []
    bridge = _bridge(lambda items: sent.append([i["subject"] for i in items]))

    sizes = {"a": 2, "b": 3, "c": 2, "d": 9, "e": 1}
    assert await bridge.forward([_incoming(n, acked, size) for n, size in sizes.items()])

    assert sent == [["a", "b"], ["c"], ["d"], ["e"]]
    assert acked == list(sizes)


class _Subscription:
    """Hands out prepared fetch results, then nothing."""

    def __init__(self, *fetches: list[IncomingMessage]) -> None:
        self.fetches = list(fetches)
        self.asked: list[int] = []

    async def fetch(self, batch: int, timeout_s: float) -> list[IncomingMessage]:
        self.asked.append(batch)
        return self.fetches.pop(0)[:batch] if self.fetches else []

    async def close(self) -> None:
        pass


async def test_bridge_lingers_to_fill_a_batch_up_to_its_count():
    acked: list[str] = []
    bridge = _bridge(lambda items: None, bridge_fetch_batch=4)
    more = _Subscription(
        [_incoming("b", acked)],
        [_incoming("c", acked), _incoming("d", acked), _incoming("e", acked)],
    )

    extra = await bridge._linger(more, 1)

    assert [m.subject for m in extra] == ["b", "c", "d"]
    assert more.asked == [3, 2]
    idle = _Subscription()
    assert await bridge._linger(idle, 1) == [] and idle.asked == [3]
