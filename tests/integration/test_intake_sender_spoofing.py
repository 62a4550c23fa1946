"""A display name dressed as an address never becomes the sender, from IMAP to the notification.

Real pymap, Postgres and intake; the notification pass renders the stored row.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from mailroom.db.engine import transaction
from mailroom.notifications.passes import create_notifications
from mailroom.recognition.finality import finalize_settled_mails
from mailroom.settings import NotificationRoute

pytestmark = pytest.mark.integration

ROUTE = NotificationRoute(
    channel="webhook", account="erp", recipient="finance", subject="Documents from {sender}"
)


async def _ingest_and_notify(env, from_header: bytes) -> tuple[object, dict]:
    env.append(b"From: " + from_header + b"\r\nSubject: wire\r\nMessage-ID: <s@x>\r\n\r\npay\r\n")
    outcome = await env.poll()
    assert outcome.status == "done", outcome
    (mail,) = await env.mails()
    async with transaction(env.sessions) as session:
        assert await finalize_settled_mails(session) == [mail.id]
        batch = await create_notifications(session, routes=[ROUTE])
    assert len(batch.message_ids) == 1
    async with env.sessions() as session:
        row = await session.execute(
            text("SELECT subject, body FROM channel_message WHERE mail_id = :id"), {"id": mail.id}
        )
    return mail, dict(row.mappings().one())


async def test_an_encoded_display_name_that_looks_like_an_address_is_only_a_name(intake_env):
    mail, message = await _ingest_and_notify(
        intake_env, b"=?utf-8?q?ceo@bank.test?= <attacker@evil.test>"
    )
    assert (mail.sender, mail.sender_name) == ("attacker@evil.test", "ceo@bank.test")
    shown = '"ceo@bank.test" <attacker@evil.test>'
    assert message["subject"] == f"Documents from {shown}"
    assert message["body"].startswith(f"Mail 'wire' from {shown} (mailbox box")


@pytest.mark.parametrize(
    ("header", "sender", "name", "shown"),
    [
        # Unquoted, so no valid phrase: the angle address still decides.
        (b"ceo@bank.test <attacker@evil.test>", "attacker@evil.test", "ceo@bank.test", None),
        (b'"ceo@bank.test" <attacker@evil.test>', "attacker@evil.test", "ceo@bank.test", None),
        (b"attacker@evil.test (ceo@bank.test)", "attacker@evil.test", "ceo@bank.test", None),
        (b"=?utf-8?q?Jane_D=C3=B6e?= <jane@x.test>", "jane@x.test", "Jane Döe", None),
        (b"jane@x.test", "jane@x.test", None, "jane@x.test"),
    ],
)
async def test_the_sender_is_the_address_of_from_and_is_shown_after_its_name(
    intake_env, header, sender, name, shown
):
    mail, message = await _ingest_and_notify(intake_env, header)
    assert (mail.sender, mail.sender_name) == (sender, name)
    expected = shown or (f'"{name}" <{sender}>' if "@" in name else f"{name} <{sender}>")
    assert message["subject"] == f"Documents from {expected}"
