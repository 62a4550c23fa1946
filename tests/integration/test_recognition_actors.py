"""Actor wiring on the StubBroker with real Postgres and NATS: nudges, follow-ups, the whole loop."""

from __future__ import annotations

import asyncio
import base64
import json
import threading

import nats as nats_py
import pytest

from actors import queues
from actors.middleware.retry_policy import RetryPolicy
from actors.notifications import notify_final_mails
from actors.recognition import (
    apply_recognition_message,
    apply_recognition_messages,
    expire_recognition_deadlines,
    map_recognition_result,
    publish_recognition_requests,
    sweep_unmapped_results,
)
from bridges.nats import NatsBridge
from mailroom.adapters.nats import NatsClient
from mailroom.adapters.storage import build_store
from mailroom.service.wire import flushed
from tests.fixtures.recognition import drain_recognition, join_stub, make_settings

pytestmark = pytest.mark.integration

ALL = (queues.OUTBOX, queues.INBOX, queues.MAPPING, queues.MAINTENANCE)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def response(ref, status, **extra):
    return json.dumps(
        {
            "schema_version": "1.0",
            "job_id": str(ref.job_id),
            "file_id": ref.file_id,
            "status": status,
            "service": {"name": "reader", "version": "1"},
            **extra,
        }
    ).encode()


@pytest.fixture
def recognition_settings(database_url, nats_url, subject_prefix, tmp_path, redis_url):
    """With the session's Redis: a mapping that makes a mail final requests a notification pass."""
    settings = make_settings(
        database_url=database_url,
        nats_url=nats_url,
        subject_prefix=subject_prefix,
        tmp_path=tmp_path,
    )
    settings.redis.url = redis_url
    return settings


@pytest.fixture
async def listener(recognition_settings):
    nc = await nats_py.connect(recognition_settings.nats.url)
    try:
        sub = await nc.subscribe(recognition_settings.nats.subject("files.tabular_uploaded"))
        await flushed(nc)  # the server knows the SUB before anything is published
        yield sub
    finally:
        await nc.close()


async def test_publish_actor_publishes_every_queued_job_in_batches(
    recognition_factory, recognition_resources, stub_broker, stub_worker, listener
):
    recognition_resources.recognition.publish_batch_size = 2
    refs = [await recognition_factory.create_job() for _ in range(5)]

    publish_recognition_requests.send()
    await drain_recognition(stub_broker, stub_worker)

    got = [await listener.next_msg(timeout=20) for _ in refs]
    assert {m.headers["Nats-Msg-Id"] for m in got} == {f"{r.job_id}:1:request" for r in refs}
    assert {(await recognition_factory.job(r.job_id))["status"] for r in refs} == {"published"}


async def test_publish_actor_skips_the_pass_when_nats_is_down(
    recognition_factory, recognition_resources, stub_broker, stub_worker
):
    recognition_resources.nats.url = "nats://127.0.0.1:1"
    recognition_resources.nats.initial_connect_attempts = 1
    ref = await recognition_factory.create_job()

    publish_recognition_requests.send()
    await drain_recognition(stub_broker, stub_worker)

    assert (await recognition_factory.job(ref.job_id))["status"] == "queued"
    assert not stub_broker.dead_letters


async def test_bad_messages_among_good_ones_never_stop_the_good_ones(
    recognition_factory, recognition_resources, stub_broker, stub_worker
):
    recognition_resources.recognition.max_message_bytes = 2_000
    refs = [
        await recognition_factory.create_job(status="published", reply_deadline="2999-01-01")
        for _ in range(3)
    ]
    subject = recognition_resources.nats.subject("files.tabular_parsed")
    bad = [b"{not json", b"[]", b'{"job_id": "nope"}', b" " * 2_001]
    messages = [response(refs[0], "processing"), *bad[:2], response(refs[1], "processing")]
    messages += [*bad[2:], response(refs[2], "processing")]
    for data in messages:
        apply_recognition_message.send(subject, b64(data), {})
    apply_recognition_message.send(subject, "***not base64***", {})

    await drain_recognition(stub_broker, stub_worker)

    assert {(await recognition_factory.job(r.job_id))["status"] for r in refs} == {"processing"}
    assert not stub_broker.dead_letters


async def test_batch_isolates_bad_items_and_a_message_the_database_refuses(
    recognition_factory, recognition_resources, stub_broker, stub_worker, monkeypatch
):
    # The refused message is sent on as its own message; give up on it at once here.
    monkeypatch.setitem(
        apply_recognition_message.options, "retry_policy", RetryPolicy(max_attempts=1)
    )
    refs = [
        await recognition_factory.create_job(status="published", reply_deadline="2999-01-01")
        for _ in range(3)
    ]
    poison = await recognition_factory.create_job(status="processing")
    subject = recognition_resources.nats.subject("files.tabular_parsed")

    def item(data, headers=None):
        return {"subject": subject, "data": b64(data), "headers": headers or {}}

    # Valid for the contract, but Postgres text cannot hold a NUL character: the database refuses it.
    refused = response(poison, "error", error={"code": "BROKEN", "message": "bad \u0000 byte"})
    apply_recognition_messages.send(
        [
            item(response(refs[0], "processing")),
            item(b"{not json"),
            "not an item",
            {"subject": subject, "data": "***not base64***", "headers": {}},
            item(refused, {"Nats-Msg-Id": f"{poison.job_id}:1:result"}),
            item(response(refs[1], "processing")),
            item(response(refs[2], "processing")),
        ]
    )

    def join() -> None:
        for _ in range(3):
            stub_broker.join(queues.INBOX, fail_fast=False)
            stub_worker.join()

    await join_stub(join, stub_broker)

    assert {(await recognition_factory.job(r.job_id))["status"] for r in refs} == {"processing"}
    assert (await recognition_factory.job(poison.job_id))["status"] == "processing"
    [dead] = stub_broker.dead_letters
    assert dead.actor_name == "apply_recognition_message"
    assert dead.args[2] == {"Nats-Msg-Id": f"{poison.job_id}:1:result"}


async def test_result_flows_from_nats_through_bridge_inbox_and_mapping_to_a_document(
    recognition_factory, recognition_resources, stub_broker, stub_worker
):
    settings = recognition_resources
    ref = await recognition_factory.create_job(status="published", reply_deadline="2999-01-01")
    store = build_store(settings)
    result = {
        "schema_version": "1.0",
        "job_id": str(ref.job_id),
        "document_type": "generic",
        "fields": {"title": {"value": "Q3", "confidence": 0.97}},
    }
    key = f"results/{ref.job_id}.json"
    await store.put("results", key, json.dumps(result).encode(), media_type="application/json")
    bridge = NatsBridge(
        NatsClient(settings.nats), apply_recognition_messages.send, settings=settings
    )
    task = asyncio.create_task(bridge.run())
    await asyncio.wait_for(bridge.ready.wait(), 30)
    nc = await nats_py.connect(settings.nats.url)
    try:
        subject = settings.nats.subject("files.tabular_parsed")
        ack = response(ref, "processing")
        done = response(ref, "done", result_s3={"bucket": store.bucket("results"), "key": key})
        await nc.publish(subject, ack, headers={"Nats-Msg-Id": f"{ref.job_id}:1:ack"})
        await nc.publish(subject, done, headers={"Nats-Msg-Id": f"{ref.job_id}:1:result"})
        await nc.publish(subject, done, headers={"Nats-Msg-Id": f"{ref.job_id}:1:result"})
        await flushed(nc)
        for _ in range(100):
            if bridge.forwarded == 2:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
    finally:
        bridge.stop()
        await task
        await nc.close()
    assert bridge.forwarded == 2, "JetStream's duplicate window dropped the repeated result"

    await drain_recognition(stub_broker, stub_worker)

    [document] = await recognition_factory.rows("SELECT * FROM document")
    assert document["fields"] == {"title": "Q3"}
    assert (await recognition_factory.file(ref.file_id))["status"] == "RECOGNIZED"
    assert (await recognition_factory.mail(ref.mail_id))["status"] == "final"


async def test_failed_result_is_replayed_and_the_publisher_is_nudged(
    recognition_factory, recognition_resources, stub_broker, stub_worker, listener
):
    ref = await recognition_factory.create_job(status="processing", reply_deadline="2999-01-01")
    data = response(ref, "error", error={"code": "OCR_FAILED", "message": "blurry"})

    apply_recognition_message.send("files.tabular_parsed", b64(data), {})
    await drain_recognition(stub_broker, stub_worker)

    retry = await listener.next_msg(timeout=20)
    file = await recognition_factory.file(ref.file_id)
    assert retry.headers["Nats-Msg-Id"] == f"{file['current_recognition_job_id']}:2:request"
    new_job = await recognition_factory.job(file["current_recognition_job_id"])
    assert (new_job["attempt"], new_job["status"]) == (2, "published")


async def test_watchdog_and_unmapped_sweep_actors(
    recognition_factory, recognition_resources, stub_broker, stub_worker
):
    late = await recognition_factory.create_job(status="published", reply_deadline="2000-01-01")
    unmapped = await recognition_factory.create_job(
        status="error",
        error_code="OCR_FAILED",
        attempt=2,
        result_msg_id="x:2:result",
        finished_at="2000-01-01",
    )

    expire_recognition_deadlines.send()
    sweep_unmapped_results.send()
    await drain_recognition(stub_broker, stub_worker)

    assert (await recognition_factory.job(late.job_id))["status"] == "timeout"
    assert (await recognition_factory.job(unmapped.job_id))["mapped_at"] is not None
    assert (await recognition_factory.file(unmapped.file_id))["status"] == "ERROR"
    map_recognition_result.send("not-a-uuid")
    await drain_recognition(stub_broker, stub_worker)
    assert not stub_broker.dead_letters


async def test_follow_up_sends_of_async_actors_run_off_the_event_loop(
    recognition_factory, recognition_resources, stub_broker, stub_worker, monkeypatch
):
    late = await recognition_factory.create_job(status="published", reply_deadline="2000-01-01")
    unmapped = [
        await recognition_factory.create_job(
            status="error",
            error_code="OCR_FAILED",
            attempt=2,
            result_msg_id=f"x{n}:2:result",
            finished_at="2000-01-01",
        )
        for n in range(3)
    ]
    expire_recognition_deadlines.send()
    sweep_unmapped_results.send()

    sent: list[tuple[str, str, bool]] = []
    enqueue = stub_broker.enqueue

    def recording_enqueue(message, *, delay=None):
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        sent.append((message.actor_name, threading.current_thread().name, on_loop))
        return enqueue(message, delay=delay)

    monkeypatch.setattr(stub_broker, "enqueue", recording_enqueue)
    await drain_recognition(stub_broker, stub_worker)

    assert (await recognition_factory.job(late.job_id))["status"] == "timeout"
    for ref in unmapped:
        assert (await recognition_factory.job(ref.job_id))["mapped_at"] is not None
    names = [name for name, _, _ in sent]
    assert names.count("map_recognition_result") == 3 and "notify_final_mails" in names
    assert [entry for entry in sent if entry[2]] == []


async def test_a_mapping_batch_sends_its_poison_on_alone_and_requests_one_notification_pass(
    recognition_factory, recognition_resources, stub_broker, stub_worker, monkeypatch
):
    # The poison is sent on as its own message; give up on it at once here.
    monkeypatch.setitem(map_recognition_result.options, "retry_policy", RetryPolicy(max_attempts=1))
    store = build_store(recognition_resources)
    refs = [
        await recognition_factory.create_job(status="published", reply_deadline="2999-01-01")
        for _ in range(3)
    ]
    subject = recognition_resources.nats.subject("files.tabular_parsed")
    items = []
    for n, ref in enumerate(refs):
        # Valid for the contract, but Postgres jsonb cannot hold a NUL character.
        title = "Q\u00003" if n == 1 else "Q3"
        result = {
            "schema_version": "1.0",
            "job_id": str(ref.job_id),
            "document_type": "generic",
            "fields": {"title": {"value": title, "confidence": 0.97}},
        }
        key = f"results/{ref.job_id}.json"
        await store.put("results", key, json.dumps(result).encode(), media_type="application/json")
        done = response(ref, "done", result_s3={"bucket": store.bucket("results"), "key": key})
        items.append({"subject": subject, "data": b64(done), "headers": {}})
    sent: list[tuple[str, tuple]] = []
    enqueue = stub_broker.enqueue

    def recording_enqueue(message, *, delay=None):
        sent.append((message.actor_name, message.args))
        return enqueue(message, delay=delay)

    monkeypatch.setattr(stub_broker, "enqueue", recording_enqueue)
    apply_recognition_messages.send(items)

    def join() -> None:
        for _ in range(3):
            for queue in ALL:
                stub_broker.join(queue, fail_fast=False)
            stub_worker.join()

    await join_stub(join, stub_broker)

    statuses = [(await recognition_factory.file(r.file_id))["status"] for r in refs]
    assert statuses == ["RECOGNIZED", "PROCESSING", "RECOGNIZED"]
    batches = [args for name, args in sent if name == "map_recognition_results"]
    assert batches == [([str(r.job_id) for r in refs],)], "one mapping message per inbox batch"
    [dead] = stub_broker.dead_letters
    assert (dead.actor_name, dead.args) == ("map_recognition_result", (str(refs[1].job_id),))
    assert [name for name, _ in sent].count("notify_final_mails") == 1, "two mails, one pass"


async def test_a_backlog_of_final_mails_is_notified_by_one_message_in_passes(
    recognition_factory, recognition_resources, stub_broker, stub_worker, monkeypatch
):
    recognition_resources.delivery.notification_batch_size = 2
    mails = [await recognition_factory.create_mail(status="final") for _ in range(5)]
    sent: list[str] = []
    enqueue = stub_broker.enqueue

    def recording_enqueue(message, *, delay=None):
        sent.append(message.actor_name)
        return enqueue(message, delay=delay)

    monkeypatch.setattr(stub_broker, "enqueue", recording_enqueue)
    notify_final_mails.send()
    await drain_recognition(stub_broker, stub_worker)

    rows = await recognition_factory.rows(
        "SELECT id FROM inbound_mail WHERE notified_at IS NOT NULL"
    )
    assert {row["id"] for row in rows} == set(mails)
    assert sent == ["notify_final_mails"], "three passes in one message, none re-sent"
