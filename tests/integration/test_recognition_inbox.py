"""The inbox (acks and results) against real Postgres, including its races."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import text

from mailroom.adapters.nats import InMemoryPublisher
from mailroom.db.engine import create_engine, create_sessionmaker
from mailroom.recognition.inbox.apply import (
    InboxMessage,
    apply_recognition_message,
    apply_recognition_messages,
)
from mailroom.recognition.outbox.relay import publish_recognition_requests
from mailroom.recognition.watchdog import expire_recognition_deadlines
from mailroom.settings import DatabaseSettings
from tests.fixtures.recognition import at

pytestmark = pytest.mark.integration

T0 = at("12:00:00")
SERVICE = {"name": "reader", "version": "2.1"}


def body(ref, status, **extra):
    message = {
        "schema_version": "1.0",
        "job_id": str(ref.job_id),
        "file_id": ref.file_id,
        "status": status,
        "service": SERVICE,
    }
    if status in ("done", "needs_check"):
        message["result_s3"] = {"bucket": "mailroom-results", "key": f"r/{ref.job_id}.json"}
        message["result_schema_version"] = "1.0"
    message.update(extra)
    return json.dumps(message).encode()


def msg_id(ref, kind, attempt=1):
    return {"Nats-Msg-Id": f"{ref.job_id}:{attempt}:{kind}"}


async def apply(sessions, data, headers=None, now=T0, subject="files.tabular_parsed"):
    return await apply_recognition_message(
        sessions, subject=subject, data=data, headers=headers or {}, max_bytes=4096, now=now
    )


@pytest.fixture
async def published(recognition_factory):
    return await recognition_factory.create_job(
        status="published", published_at=T0, reply_deadline=T0 + timedelta(minutes=5)
    )


async def test_ack_moves_a_published_job_to_processing_and_its_file(
    db_sessions, recognition_factory, published
):
    outcome = await apply(db_sessions, body(published, "processing"), msg_id(published, "ack"))

    assert outcome.applied == "ack_applied" and outcome.map_job_id is None
    job = await recognition_factory.job(published.job_id)
    assert job["status"] == "processing"
    assert job["started_at"] == T0
    assert (job["service_name"], job["service_version"]) == ("reader", "2.1")
    assert (await recognition_factory.file(published.file_id))["status"] == "PROCESSING"


async def test_repeated_ack_is_ignored_quietly_and_ack_in_other_status_warns(
    db_sessions, recognition_factory, published, mailroom_logs
):
    await apply(db_sessions, body(published, "processing"), msg_id(published, "ack"))
    repeated = await apply(
        db_sessions, body(published, "processing"), msg_id(published, "ack"), now=T0 + timedelta(1)
    )
    assert repeated.applied == "ack_repeated"
    assert mailroom_logs.messages() == []
    assert (await recognition_factory.job(published.job_id))["started_at"] == T0

    queued = await recognition_factory.create_job()
    outcome = await apply(db_sessions, body(queued, "processing"), msg_id(queued, "ack"))
    assert outcome.applied == "ack_unexpected"
    assert (await recognition_factory.job(queued.job_id))["status"] == "queued"
    assert any("in status queued" in m for m in mailroom_logs.messages())


async def test_ack_does_not_move_a_file_out_of_a_final_status(db_sessions, recognition_factory):
    ref = await recognition_factory.create_job(
        status="published", reply_deadline=T0 + timedelta(minutes=5), file_status="NEEDS_CHECK"
    )
    await apply(db_sessions, body(ref, "processing"), msg_id(ref, "ack"))
    assert (await recognition_factory.file(ref.file_id))["status"] == "NEEDS_CHECK"


@pytest.mark.parametrize(
    "data",
    [
        b"not json at all",
        b"[1, 2, 3]",
        json.dumps({"job_id": "j-1", "status": "SECRET-BODY", "extra": "SECRET-BODY"}).encode(),
        json.dumps({"job_id": "x" * 500, "service": {"name": "SECRET-BODY"}}).encode(),
        b"\xff\xfe\x00",
        b"{" * 5000,
    ],
)
async def test_invalid_body_is_rejected_with_a_warning_that_never_holds_the_body(
    db_sessions, data, mailroom_logs
):
    outcome = await apply(db_sessions, data, subject="p.files.tabular_parsed")

    assert outcome.applied == "rejected"
    [warning] = mailroom_logs.messages()
    assert "p.files.tabular_parsed" in warning
    assert f"{len(data)} bytes" in warning
    assert "SECRET-BODY" not in warning
    assert len(warning) < 400, "the job id is truncated"


@pytest.mark.parametrize(
    "encode",
    [
        lambda text: text.encode("utf-16"),
        lambda text: b"\xef\xbb\xbf" + text.encode(),
        lambda text: text.replace('"2.1"', '"\\ud800"').encode(),
    ],
    ids=["utf-16", "byte-order-mark", "lone-surrogate"],
)
async def test_a_result_that_is_not_utf8_json_is_rejected_and_changes_nothing(
    db_sessions, recognition_factory, published, encode, mailroom_logs
):
    data = encode(body(published, "done").decode())
    outcome = await apply(db_sessions, data, msg_id(published, "result"))

    assert outcome.applied == "rejected"
    assert (await recognition_factory.job(published.job_id))["status"] == "published"
    assert any("not a JSON object" in m for m in mailroom_logs.messages())


async def test_int_array_literals_round_trip(db_sessions):
    from mailroom.db.params import int_array

    values = [1, -2, 2**62, 7]
    async with db_sessions() as session:
        got = await session.scalar(text("SELECT CAST(:v AS bigint[])"), {"v": int_array(values)})
        empty = await session.scalar(text("SELECT CAST(:v AS bigint[])"), {"v": int_array([])})
    assert (got, empty) == (values, [])


async def test_done_result_without_result_s3_is_not_the_contract(
    db_sessions, recognition_factory, published
):
    data = json.loads(body(published, "done"))
    del data["result_s3"]
    outcome = await apply(db_sessions, json.dumps(data).encode(), msg_id(published, "result"))
    # It names a waiting job: that job fails at once (test_recognition_contract_violations.py).
    assert outcome.applied == "contract_violation"
    job = await recognition_factory.job(published.job_id)
    assert (job["status"], job["error_code"]) == ("error", "INVALID_RESULT")


async def test_unknown_job_and_file_mismatch_change_nothing(
    db_sessions, recognition_factory, published, mailroom_logs
):
    ghost = type(published)(uuid.uuid4(), published.file_id, None, None)
    assert (await apply(db_sessions, body(ghost, "processing"))).applied == "unknown_job"

    wrong_file = type(published)(published.job_id, published.file_id + 1000, None, None)
    outcome = await apply(db_sessions, body(wrong_file, "done"), msg_id(published, "result"))
    assert outcome.applied == "file_mismatch"
    assert (await recognition_factory.job(published.job_id))["status"] == "published"
    assert len(mailroom_logs.messages()) == 2


async def test_missing_msg_id_is_derived_from_the_job_and_warned(
    db_sessions, recognition_factory, published, mailroom_logs
):
    outcome = await apply(db_sessions, body(published, "done"), headers={})

    assert outcome.applied == "result_applied"
    job = await recognition_factory.job(published.job_id)
    assert job["result_msg_id"] == f"{published.job_id}:1:result"
    assert any("no Nats-Msg-Id" in m for m in mailroom_logs.messages())


async def test_done_result_is_applied_with_object_metrics_and_counters(
    db_sessions, recognition_factory
):
    ref = await recognition_factory.create_job(
        status="processing",
        reply_deadline=T0 + timedelta(minutes=5),
        metrics={"republish_count": 2, "source": "ours", "clash": "ours"},
    )
    metrics = {
        "fields_total": 9,
        "fields_low_confidence": 2,
        "fields_unrecognized": 1,
        "clash": "theirs",
        "ms": 40,
    }

    outcome = await apply(db_sessions, body(ref, "done", metrics=metrics), msg_id(ref, "result"))

    assert outcome.applied == "result_applied" and outcome.map_job_id == ref.job_id
    job = await recognition_factory.job(ref.job_id)
    assert job["status"] == "done"
    assert job["finished_at"] == T0
    assert job["service_name"] == "reader"
    assert job["metrics"] == {"republish_count": 2, "source": "ours", **metrics}
    assert (job["fields_total"], job["fields_low_confidence"], job["fields_unrecognized"]) == (
        9,
        2,
        1,
    )
    assert job["result_schema_version"] == "1.0"
    assert job["result_msg_id"] == f"{ref.job_id}:1:result"
    [obj] = await recognition_factory.rows(
        "SELECT * FROM stored_object WHERE id = :id", {"id": job["result_object_id"]}
    )
    assert (obj["bucket_role"], obj["key"]) == ("results", f"r/{ref.job_id}.json")
    assert (await recognition_factory.file(ref.file_id))["status"] == "PROCESSING"


async def test_result_object_is_reused_when_already_registered(db_sessions, recognition_factory):
    one = await recognition_factory.create_job(status="processing")
    two = await recognition_factory.create_job(status="processing")
    shared = {"result_s3": {"bucket": "mailroom-results", "key": "shared.json"}}

    await apply(db_sessions, body(one, "done", **shared), msg_id(one, "result"))
    await apply(db_sessions, body(two, "done", **shared), msg_id(two, "result"))

    ids = {(await recognition_factory.job(r.job_id))["result_object_id"] for r in (one, two)}
    assert len(ids) == 1


async def test_error_result_fails_the_file_with_code_and_message(
    db_sessions, recognition_factory, published
):
    error = {"code": "UNREADABLE", "message": "page 2 is blank"}
    outcome = await apply(
        db_sessions, body(published, "error", error=error), msg_id(published, "result")
    )

    assert outcome.map_job_id == published.job_id
    job = await recognition_factory.job(published.job_id)
    assert (job["status"], job["error_code"], job["error_message"]) == (
        "error",
        "UNREADABLE",
        "page 2 is blank",
    )
    assert job["result_object_id"] is None
    file = await recognition_factory.file(published.file_id)
    assert file["status"] == "ERROR" and "UNREADABLE" in file["status_reason"]


async def test_duplicate_result_changes_nothing(db_sessions, recognition_factory, published):
    await apply(db_sessions, body(published, "done"), msg_id(published, "result"))
    before = await recognition_factory.job(published.job_id)

    again = await apply(
        db_sessions, body(published, "done"), msg_id(published, "result"), now=T0 + timedelta(1)
    )

    assert again.applied == "result_duplicate" and again.map_job_id is None
    assert await recognition_factory.job(published.job_id) == before


async def test_late_result_for_a_final_job_warns_and_changes_nothing(
    db_sessions, recognition_factory, mailroom_logs
):
    ref = await recognition_factory.create_job(
        status="timeout", error_code="TIMEOUT", file_status="ERROR"
    )

    outcome = await apply(db_sessions, body(ref, "done"), msg_id(ref, "result"))

    assert outcome.applied == "result_late"
    job = await recognition_factory.job(ref.job_id)
    assert (job["status"], job["result_msg_id"]) == ("timeout", None)
    assert any("Late result" in m for m in mailroom_logs.messages())


async def test_result_before_its_ack_is_applied_and_the_late_ack_is_ignored_quietly(
    db_sessions, recognition_factory, published, mailroom_logs
):
    result = await apply(db_sessions, body(published, "done"), msg_id(published, "result"))
    ack = await apply(db_sessions, body(published, "processing"), msg_id(published, "ack"))

    assert (result.applied, ack.applied) == ("result_applied", "ack_after_result")
    assert (await recognition_factory.job(published.job_id))["status"] == "done"
    # An ack overtaken by its own result is the normal race of parallel batches: no warning.
    assert mailroom_logs.messages() == []


async def test_answer_to_an_old_attempt_never_changes_the_file(db_sessions, recognition_factory):
    old = await recognition_factory.create_job(status="processing", current=False)
    await recognition_factory.create_job(file_id=old.file_id, attempt=2)

    await apply(db_sessions, body(old, "error", error={"code": "X"}), msg_id(old, "result"))

    assert (await recognition_factory.job(old.job_id))["status"] == "error"
    assert (await recognition_factory.file(old.file_id))["status"] == "UPLOADED"


async def test_ack_waits_for_the_publisher_holding_the_row_and_applies_after_its_commit(
    db_sessions, recognition_factory, recognition_settings
):
    ref = await recognition_factory.create_job()
    release, holding = asyncio.Event(), asyncio.Event()

    class HoldingPublisher(InMemoryPublisher):
        async def publish_batch(self, messages):
            holding.set()
            await release.wait()
            return await super().publish_batch(messages)

    publishing = asyncio.create_task(
        publish_recognition_requests(
            db_sessions,
            HoldingPublisher(),
            nats=recognition_settings.nats,
            recognition=recognition_settings.recognition,
            now=T0,
        )
    )
    await holding.wait()
    ack = asyncio.create_task(apply(db_sessions, body(ref, "processing"), msg_id(ref, "ack")))
    await asyncio.sleep(0.3)
    assert not ack.done(), "the ack waits for the publisher's row lock"
    release.set()
    await publishing

    assert (await ack).applied == "ack_applied"
    assert (await recognition_factory.job(ref.job_id))["status"] == "processing"


@pytest.mark.parametrize("first", ["watchdog", "result"])
async def test_watchdog_and_result_race_whoever_locks_first_decides(
    db_sessions, recognition_factory, first
):
    ref = await recognition_factory.create_job(
        status="processing", reply_deadline=T0 - timedelta(seconds=1)
    )
    result = lambda: apply(db_sessions, body(ref, "done"), msg_id(ref, "result"))  # noqa: E731
    if first == "watchdog":
        timed_out = await expire_recognition_deadlines(db_sessions, now=T0, automatic_attempts=1)
        applied = await result()
        assert timed_out.timed_out == [ref.job_id]
        assert applied.applied == "result_late"
        expected = ("timeout", "ERROR")
    else:
        # The inbox holds the row: the watchdog skips it (SKIP LOCKED) instead of waiting,
        # and the result, once committed, leaves nothing for a later pass.
        async with db_sessions() as inbox, inbox.begin():
            await inbox.execute(
                text("SELECT 1 FROM recognition_job WHERE id = :id FOR UPDATE"),
                {"id": ref.job_id},
            )
            skipped = await asyncio.wait_for(
                expire_recognition_deadlines(db_sessions, now=T0), timeout=5
            )
        assert skipped.timed_out == []
        assert (await result()).applied == "result_applied"
        assert (await expire_recognition_deadlines(db_sessions, now=T0)).timed_out == []
        expected = ("done", "PROCESSING")

    job = await recognition_factory.job(ref.job_id)
    file = await recognition_factory.file(ref.file_id)
    assert (job["status"], file["status"]) == expected


async def test_database_errors_propagate_so_the_actor_retries(published, postgres_server):
    engine = create_engine(DatabaseSettings(url=postgres_server.url("no_such_database")))
    try:
        with pytest.raises(Exception, match="no_such_database"):
            await apply(create_sessionmaker(engine), body(published, "processing"))
    finally:
        await engine.dispose()


# Batches: the bridge forwards many messages in one actor message, applied in one transaction.


async def apply_batch(sessions, messages, now=T0):
    return await apply_recognition_messages(
        sessions,
        [InboxMessage("files.tabular_parsed", data, headers) for data, headers in messages],
        max_bytes=4096,
        now=now,
    )


async def test_batch_applies_each_message_in_order_as_if_alone(
    db_sessions, recognition_factory, published, mailroom_logs
):
    failing = await recognition_factory.create_job(status="processing")
    ghost = type(published)(uuid.uuid4(), published.file_id, None, None)
    error = {"code": "UNREADABLE", "message": "blank"}

    outcomes = await apply_batch(
        db_sessions,
        [
            (body(published, "processing"), msg_id(published, "ack")),
            (b"not json", {}),
            (body(published, "processing"), msg_id(published, "ack")),
            (body(published, "done"), msg_id(published, "result")),
            (body(published, "done"), msg_id(published, "result")),
            (body(ghost, "processing"), {}),
            (body(failing, "error", error=error), msg_id(failing, "result")),
            (body(failing, "done"), msg_id(failing, "result", attempt=2)),
        ],
    )

    assert [o.applied for o in outcomes] == [
        "ack_applied",
        "rejected",
        "ack_repeated",
        "result_applied",
        "result_duplicate",
        "unknown_job",
        "result_applied",
        "msg_id_mismatch",
    ]
    assert [o.map_job_id for o in outcomes if o.map_job_id] == [published.job_id, failing.job_id]
    job = await recognition_factory.job(published.job_id)
    assert (job["status"], job["started_at"], job["finished_at"]) == ("done", T0, T0)
    assert job["result_msg_id"] == f"{published.job_id}:1:result"
    assert job["result_object_id"] is not None
    assert (await recognition_factory.file(published.file_id))["status"] == "PROCESSING"
    failed = await recognition_factory.job(failing.job_id)
    assert (failed["status"], failed["error_code"], failed["result_object_id"]) == (
        "error",
        "UNREADABLE",
        None,
    )
    assert (await recognition_factory.file(failing.file_id))["status"] == "ERROR"
    warnings = mailroom_logs.messages()
    assert len(warnings) == 3, warnings  # not JSON, unknown job, another attempt's id
    assert not any("not json" in w for w in warnings)


async def test_batch_registers_a_shared_result_object_once(db_sessions, recognition_factory):
    refs = [await recognition_factory.create_job(status="processing") for _ in range(3)]
    shared = {"result_s3": {"bucket": "mailroom-results", "key": "shared.json"}}

    await apply_batch(db_sessions, [(body(r, "done", **shared), msg_id(r, "result")) for r in refs])

    ids = {(await recognition_factory.job(r.job_id))["result_object_id"] for r in refs}
    assert len(ids) == 1 and None not in ids


async def test_message_the_database_refuses_fails_alone_and_its_neighbours_apply(
    db_sessions, recognition_factory, mailroom_logs
):
    good = [await recognition_factory.create_job(status="processing") for _ in range(2)]
    poison = await recognition_factory.create_job(status="processing")
    # Valid for the contract, but Postgres text cannot hold a NUL character: the database refuses it.
    refused = {"error": {"code": "BROKEN", "message": "bad \u0000 byte"}}

    outcomes = await apply_batch(
        db_sessions,
        [
            (body(good[0], "done"), msg_id(good[0], "result")),
            (body(poison, "error", **refused), msg_id(poison, "result")),
            (body(good[1], "done"), msg_id(good[1], "result")),
        ],
    )

    assert [o.applied for o in outcomes] == ["result_applied", "failed", "result_applied"]
    assert outcomes[1].job_id == poison.job_id and outcomes[1].error is not None
    assert {(await recognition_factory.job(r.job_id))["status"] for r in good} == {"done"}
    assert (await recognition_factory.job(poison.job_id))["status"] == "processing"
    assert any("one by one" in m for m in mailroom_logs.messages())


async def test_batch_waits_for_a_locked_job_and_applies_after_its_holder_commits(
    db_sessions, recognition_factory, published
):
    other = await recognition_factory.create_job(
        status="published", reply_deadline=T0 + timedelta(minutes=5)
    )
    async with db_sessions() as holder, holder.begin():
        await holder.execute(
            text("SELECT 1 FROM recognition_job WHERE id = :id FOR UPDATE"), {"id": other.job_id}
        )
        batch = asyncio.create_task(
            apply_batch(
                db_sessions,
                [
                    (body(published, "processing"), msg_id(published, "ack")),
                    (body(other, "processing"), msg_id(other, "ack")),
                ],
            )
        )
        await asyncio.sleep(0.3)
        assert not batch.done(), "the batch waits for the row lock"
        await holder.execute(
            text("UPDATE recognition_job SET status = 'timeout' WHERE id = :id"),
            {"id": other.job_id},
        )

    assert [o.applied for o in await batch] == ["ack_applied", "ack_unexpected"]
    assert (await recognition_factory.job(other.job_id))["status"] == "timeout"


async def test_batch_raises_when_no_message_can_be_applied(published, postgres_server):
    engine = create_engine(DatabaseSettings(url=postgres_server.url("no_such_database")))
    try:
        with pytest.raises(Exception, match="no_such_database"):
            await apply_batch(
                create_sessionmaker(engine),
                [(body(published, "processing"), {}), (body(published, "done"), {})],
            )
    finally:
        await engine.dispose()


async def test_batch_statements_do_not_grow_with_its_messages_and_the_time_is_the_databases(
    db_sessions, recognition_factory
):
    """No statement per message and no separate ``SELECT now()``: the lock brings the time."""
    from sqlalchemy import event

    refs = [await recognition_factory.create_job(status="published") for _ in range(6)]
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        statements.append(" ".join(statement.split()))

    event.listen(db_sessions.kw["bind"].sync_engine, "before_cursor_execute", record)
    results = [(body(r, "done"), msg_id(r, "result")) for r in refs]

    await apply_batch(db_sessions, results[:1], now=None)
    for_one = len(statements)
    await apply_batch(db_sessions, results[1:], now=None)

    assert len(statements) - for_one == for_one
    assert not [s for s in statements if re.fullmatch(r"SELECT now\(\)( AS \w+)?", s)]
    async with db_sessions() as session:
        db_time = await session.scalar(text("SELECT now()"))
    for ref in refs:
        job = await recognition_factory.job(ref.job_id)
        assert job["status"] == "done" and job["finished_at"] <= db_time
        assert (await recognition_factory.file(ref.file_id))["updated_at"] <= db_time


async def test_routine_answers_log_one_info_line_a_batch_and_the_unusual_one_each(
    db_sessions, recognition_factory, published, mailroom_logs
):
    # An ack and a done result: one INFO line each, the counts of their batch
    await apply(db_sessions, body(published, "processing"), msg_id(published, "ack"))
    await apply(db_sessions, body(published, "done"), msg_id(published, "result"))
    assert mailroom_logs.messages(logging.INFO) == [
        "Recognition batch applied 1 ack(s) and 0 result(s)",
        "Recognition batch applied 0 ack(s) and 1 result(s) (done 1)",
    ]
    assert any(str(published.job_id) in m for m in mailroom_logs.messages(logging.DEBUG))

    # An error result also gets a line of its own, with the job's id
    failing = await recognition_factory.create_job(status="published", reply_deadline="2999-01-01")
    error = {"code": "BROKEN", "message": "unreadable"}
    await apply(db_sessions, body(failing, "error", error=error), msg_id(failing, "result"))
    assert mailroom_logs.messages(logging.INFO)[2:] == [
        f"Recognition job {failing.job_id} result applied: error",
        "Recognition batch applied 0 ack(s) and 1 result(s) (error 1)",
    ]
