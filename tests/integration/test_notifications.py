"""Final mails become notifications once per final state, routed by mailbox and document type."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
import redis.asyncio as aioredis

from mailroom.db.engine import transaction
from mailroom.notifications.passes import create_notifications, notify_final_mails
from mailroom.settings import DeliverySettings, NotificationRoute

pytestmark = pytest.mark.integration


async def _final_mail_with_document(factory, *, fields, document_type="invoice"):
    ref = await factory.create_job(status="done", file_status="RECOGNIZED", original_name="inv.csv")
    await factory._execute(
        "INSERT INTO document (file_id, job_id, document_type, fields, status) "
        "VALUES (:file, :job, :type, CAST(:fields AS jsonb), 'ok')",
        {
            "file": ref.file_id,
            "job": ref.job_id,
            "type": document_type,
            "fields": json.dumps(fields),
        },
    )
    await factory._execute(
        "UPDATE inbound_mail SET status = 'final', finalized_at = now(), sender = 'a@b.test' "
        "WHERE id = :id",
        {"id": ref.mail_id},
    )
    return ref


async def test_a_final_mail_gets_one_message_per_matching_route(recognition_factory, db_sessions):
    ref = await _final_mail_with_document(
        recognition_factory, fields={"invoice_number": "A-1", "total": "10.50"}
    )
    routes = [
        NotificationRoute(channel="log", recipient="ops"),
        NotificationRoute(
            document_type="invoice",
            channel="webhook",
            account="erp",
            recipient="erp",
            subject="Invoice in {mailbox}",
            template="{document_types}: {summary}",
        ),
        NotificationRoute(document_type="receipt", channel="email", recipient="x@y.test"),
        NotificationRoute(mailbox="other", channel="log", recipient="nobody"),
    ]
    now = datetime.now(UTC)
    async with transaction(db_sessions) as session:
        batch = await create_notifications(session, routes=routes, now=now)
    assert batch.mails == 1
    assert len(batch.message_ids) == 2
    messages = await recognition_factory.rows(
        "SELECT channel, account, recipient, subject, body, status, mail_id FROM channel_message "
        "ORDER BY id"
    )
    assert [(m["channel"], m["recipient"]) for m in messages] == [
        ("log", "ops"),
        ("webhook", "erp"),
    ]
    assert all(m["status"] == "pending" and m["mail_id"] == ref.mail_id for m in messages)
    assert messages[1]["subject"] == "Invoice in test"
    assert "invoice_number=A-1" in messages[1]["body"]
    assert messages[1]["body"].startswith("invoice: Mail 'test' from a@b.test")

    # A second pass finds nothing to do: one notification per final state.
    async with transaction(db_sessions) as session:
        again = await create_notifications(session, routes=routes, now=now)
    assert again.message_ids == [] and again.mails == 0


async def test_notify_final_mails_puts_the_messages_on_the_stream(
    recognition_factory, db_sessions, redis_url
):
    await _final_mail_with_document(recognition_factory, fields={"total": "3"})
    settings = DeliverySettings(stream_key="test:notify", routes=[NotificationRoute()])
    client = aioredis.Redis.from_url(redis_url)
    try:
        ids, more = await notify_final_mails(sessions=db_sessions, redis=client, settings=settings)
        entries = await client.xrange("test:notify")
    finally:
        await client.aclose()
    assert len(ids) == 1 and not more
    assert len(entries) == 1
    (row,) = await recognition_factory.rows("SELECT enqueued_at FROM channel_message")
    assert row["enqueued_at"] is not None


async def test_mails_that_are_not_final_are_not_notified(recognition_factory, db_sessions):
    await recognition_factory.create_job(status="processing", file_status="PROCESSING")
    async with transaction(db_sessions) as session:
        batch = await create_notifications(
            session, routes=[NotificationRoute()], now=datetime.now(UTC)
        )
    assert batch.mails == 0


async def test_a_mail_without_attachments_is_finalized_and_notified(
    recognition_factory, db_sessions, redis_url
):
    mail_id = await recognition_factory.create_mail(status="stored")
    pending = await recognition_factory.create_job(status="processing", file_status="PROCESSING")
    settings = DeliverySettings(stream_key="test:notify2", routes=[NotificationRoute()])
    client = aioredis.Redis.from_url(redis_url)
    try:
        ids, _ = await notify_final_mails(sessions=db_sessions, redis=client, settings=settings)
    finally:
        await client.aclose()
    assert len(ids) == 1
    assert (await recognition_factory.mail(mail_id))["status"] == "final"
    assert (await recognition_factory.mail(pending.mail_id))["status"] == "stored"
    (message,) = await recognition_factory.rows("SELECT body, mail_id FROM channel_message")
    assert message["mail_id"] == mail_id
    assert "no attachments" in message["body"]


async def test_a_notification_pass_handles_at_most_its_batch_size(
    recognition_factory, db_sessions, redis_url
):
    first = await recognition_factory.create_mail(status="stored")
    second = await recognition_factory.create_mail(status="stored")
    settings = DeliverySettings(
        stream_key="test:notify3", routes=[NotificationRoute()], notification_batch_size=1
    )
    client = aioredis.Redis.from_url(redis_url)
    try:
        ids, more = await notify_final_mails(sessions=db_sessions, redis=client, settings=settings)
        later, _ = await notify_final_mails(sessions=db_sessions, redis=client, settings=settings)
    finally:
        await client.aclose()
    assert (len(ids), more, len(later)) == (1, True, 1)
    notified = await recognition_factory.rows("SELECT mail_id FROM channel_message ORDER BY id")
    assert sorted(row["mail_id"] for row in notified) == sorted([first, second])
