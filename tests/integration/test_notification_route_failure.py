"""A route that raises fails its own notification, never the pass."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mailroom.db.engine import transaction
from mailroom.notifications.passes import create_notifications
from mailroom.settings import NotificationRoute
from tests.integration.test_notifications import _final_mail_with_document

pytestmark = pytest.mark.integration


async def test_a_raising_template_fails_its_message_and_the_others_go_out(
    recognition_factory, db_sessions
):
    first = await _final_mail_with_document(recognition_factory, fields={"total": "1"})
    second = await _final_mail_with_document(recognition_factory, fields={"total": "2"})
    # Load checks cannot see everything (a value's format spec, a route built in code).
    broken = NotificationRoute.model_construct(
        mailbox="*",
        document_type="*",
        channel="webhook",
        account="erp",
        recipient="erp",
        subject="x",
        template="{not_a_placeholder}",
    )
    routes = [broken, NotificationRoute(channel="log", recipient="ops")]

    async with transaction(db_sessions) as session:
        batch = await create_notifications(session, routes=routes, now=datetime.now(UTC))

    assert batch.mails == 2 and len(batch.message_ids) == 2, "only the good route is enqueued"
    messages = await recognition_factory.rows(
        "SELECT id, mail_id, channel, status, last_error FROM channel_message ORDER BY mail_id, id"
    )
    assert [(m["mail_id"], m["channel"], m["status"]) for m in messages] == [
        (first.mail_id, "webhook", "failed"),
        (first.mail_id, "log", "pending"),
        (second.mail_id, "webhook", "failed"),
        (second.mail_id, "log", "pending"),
    ]
    assert messages[0]["last_error"].startswith("ROUTE_FAILED: route 0: KeyError")
    assert {m["id"] for m in messages if m["status"] == "pending"} == set(batch.message_ids)
    mails = await recognition_factory.rows("SELECT notified_at FROM inbound_mail")
    assert all(m["notified_at"] is not None for m in mails)
