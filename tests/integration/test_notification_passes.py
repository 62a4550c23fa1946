"""Notification passes are coalesced, and a mail made final while a pass runs still gets one."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from mailroom.notifications import passes as notifications
from mailroom.notifications.passes import (
    PASS_REQUEST_TTL_S,
    notify_final_mails,
    pass_request_key,
    request_pass,
    request_settle,
    settle_request_key,
)
from mailroom.settings import DeliverySettings, NotificationRoute
from tests.fixtures.plans import plan_nodes

pytestmark = pytest.mark.integration


@pytest.fixture
def delivery():
    return DeliverySettings(stream_key=f"test:{uuid.uuid4().hex}", routes=[NotificationRoute()])


@pytest.fixture
async def client(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def notified(factory):
    return {row["mail_id"] for row in await factory.rows("SELECT mail_id FROM channel_message")}


async def test_requests_wait_for_the_queued_pass_which_sees_their_mails(
    recognition_factory, db_sessions, client, delivery
):
    first = await recognition_factory.create_mail(status="final")
    assert await request_pass(client, delivery) is True, "no pass queued: send one"
    second = await recognition_factory.create_mail(status="final")
    assert await request_pass(client, delivery) is False, "the queued pass has not started"
    assert 0 < await client.ttl(pass_request_key(delivery)) <= PASS_REQUEST_TTL_S

    await notify_final_mails(sessions=db_sessions, redis=client, settings=delivery)

    assert await notified(recognition_factory) == {first, second}
    assert await request_pass(client, delivery) is True, "the pass cleared the mark"


async def test_a_mail_made_final_while_a_pass_runs_gets_a_pass_of_its_own(
    recognition_factory, db_sessions, client, delivery, monkeypatch
):
    early = await recognition_factory.create_mail(status="final")
    assert await request_pass(client, delivery) is True
    late: list[int] = []
    requests: list[bool] = []
    create = notifications.create_notifications

    async def create_then_finalize_another(session, **kwargs):
        batch = await create(session, **kwargs)
        # Another process, after this pass has read its mails: a mail becomes final and
        # its finisher asks for a pass.
        late.append(await recognition_factory.create_mail(status="final"))
        requests.append(await request_pass(client, delivery))
        return batch

    monkeypatch.setattr(notifications, "create_notifications", create_then_finalize_another)
    await notify_final_mails(sessions=db_sessions, redis=client, settings=delivery)
    monkeypatch.setattr(notifications, "create_notifications", create)

    assert await notified(recognition_factory) == {early}, "this pass had read before"
    assert requests == [True], "so the request sends a new pass"
    await notify_final_mails(sessions=db_sessions, redis=client, settings=delivery)
    assert await notified(recognition_factory) == {early, *late}


async def test_a_request_redis_cannot_record_sends_a_pass_anyway(delivery):
    down = aioredis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))
    try:
        assert await request_pass(down, delivery) is True
    finally:
        await down.aclose()


async def test_a_pass_a_finisher_asked_for_looks_for_settled_mails_only_when_asked(
    recognition_factory, db_sessions, client, delivery
):
    # A stored mail with no file to recognize: only the settle scan makes it final.
    bare = await recognition_factory.create_mail(status="stored")

    await notify_final_mails(sessions=db_sessions, redis=client, settings=delivery, settle=False)
    assert (await recognition_factory.mail(bare))["status"] == "stored", "no scan unasked"

    assert await request_settle(client, delivery) is True  # as intake asks, having stored it
    await notify_final_mails(sessions=db_sessions, redis=client, settings=delivery, settle=False)
    assert (await recognition_factory.mail(bare))["status"] == "final"
    assert await notified(recognition_factory) == {bare}
    assert await client.exists(settle_request_key(delivery)) == 0, "the pass took the mark"


async def test_settled_mails_past_one_pass_leave_the_settle_mark_for_the_next(
    recognition_factory, db_sessions, client
):
    delivery = DeliverySettings(
        stream_key=f"test:{uuid.uuid4().hex}",
        routes=[NotificationRoute()],
        notification_batch_size=1,
    )
    first = await recognition_factory.create_mail(status="stored")
    second = await recognition_factory.create_mail(status="stored")
    await request_settle(client, delivery)

    _, more = await notify_final_mails(
        sessions=db_sessions, redis=client, settings=delivery, settle=False
    )
    assert more and await client.exists(settle_request_key(delivery)) == 1
    await notify_final_mails(sessions=db_sessions, redis=client, settings=delivery, settle=False)

    assert await notified(recognition_factory) == {first, second}


async def test_the_settle_check_reads_the_stored_mails_only_not_the_history(
    recognition_factory, db_sessions
):
    from sqlalchemy import text

    from mailroom.db.engine import autocommit
    from mailroom.recognition.finality import _SETTLED_STORED_MAILS, finalize_settled_mails

    # A history of final mails, and a few still stored, with their statistics taken
    history = await recognition_factory.create_mail(status="final")
    waiting = [await recognition_factory.create_mail() for _ in range(3)]
    async with autocommit(db_sessions) as connection:
        await connection.execute(
            text(
                "INSERT INTO inbound_mail (cursor_id, uidvalidity, uid, subject, status) "
                "SELECT cursor_id, 1, 100000 + n, 'old', 'final' "
                "FROM inbound_mail, generate_series(1, 20000) AS n WHERE id = :id"
            ),
            {"id": history},
        )
        await connection.execute(text("ANALYZE inbound_mail"))
        [plan] = (
            await connection.exec_driver_sql(
                "EXPLAIN (FORMAT JSON) " + str(_SETTLED_STORED_MAILS).replace(":limit", "500")
            )
        ).scalar_one()

    # Then the check finds them through the stored mails' index, not by reading every mail
    scans = [
        (node["Node Type"], node.get("Relation Name"), node.get("Index Name"))
        for node in plan_nodes(plan["Plan"])
    ]
    assert any(index == "ix_inbound_mail_stored" for _, _, index in scans), scans
    assert ("Seq Scan", "inbound_mail", None) not in scans, scans
    async with db_sessions() as session, session.begin():
        assert await finalize_settled_mails(session) == waiting
