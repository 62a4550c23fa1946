"""A CR, LF or control character bound for an e-mail header fails the message once, with the reason.

Through the real deliverer (Postgres, Redis) against the aiosmtpd sink: nothing is
sent, the message is not retried, and no traceback is logged.
"""

from __future__ import annotations

import logging

import pytest

from mailroom.adapters.channels import ChannelOutbound
from mailroom.adapters.redis import DeliveryRedis
from mailroom.delivery.deliver import Deliverer
from mailroom.delivery.locks import LockOwner
from mailroom.delivery.outcomes import Outcome
from mailroom.settings import EmailAccount
from tests.fixtures.delivery import load_message, make_message

pytestmark = pytest.mark.integration


async def deliver_mail(settings, sessions, redis, smtp_sink, *, sender: str, **message):
    account = EmailAccount(host="127.0.0.1", port=smtp_sink.port, security="plain", timeout_s=2)
    # Copied, not validated: settings refuse such a sender at load; the send checks it again.
    account = account.model_copy(update={"sender": sender})
    settings = settings.model_copy(update={"email_accounts": {"default": account}})
    keys = DeliveryRedis(redis, stream_key=settings.stream_key)
    outbound = ChannelOutbound(settings, redis=keys)
    deliverer = Deliverer(
        sessions=sessions,
        redis=keys,
        outbound=outbound,
        settings=settings,
        owner=LockOwner("worker-a", started_at=1.0),
    )
    message_id = await make_message(sessions, channel="email", **message)
    try:
        outcome = await deliverer.deliver(message_id)
    finally:
        await outbound.aclose()
    return outcome, await load_message(sessions, message_id)


@pytest.mark.parametrize(
    ("message", "sender", "reason"),
    [
        ({"subject": "Invoice\r\nBcc: all@evil.test"}, "mailroom@corp.test", "header Subject"),
        ({"recipient": "ops@corp.test\nBcc: all@evil.test"}, "mailroom@corp.test", "header To"),
        ({"subject": "Invoice \x1b[2J 42"}, "mailroom@corp.test", "header Subject"),
        ({}, "mailroom@corp.test\r\nBcc: all@evil.test", "header From"),
    ],
    ids=["subject-crlf", "recipient-lf", "subject-escape", "sender-crlf"],
)
async def test_a_control_character_in_a_header_fails_the_message_once(
    delivery_settings, delivery_sessions, delivery_redis, smtp_sink, caplog, message, sender, reason
):
    with caplog.at_level(logging.INFO):
        outcome, row = await deliver_mail(
            delivery_settings,
            delivery_sessions,
            delivery_redis,
            smtp_sink,
            sender=sender,
            **message,
        )
    assert outcome == Outcome.FAILED
    assert (row.status, row.attempts, row.next_retry_at) == ("failed", 1, None)
    assert "UnsafeHeaderValue" in row.last_error and reason in row.last_error
    assert smtp_sink.handler.mails == []
    assert not [record for record in caplog.records if record.exc_info]


async def test_a_clean_subject_in_any_script_is_sent(
    delivery_settings, delivery_sessions, delivery_redis, smtp_sink
):
    outcome, _ = await deliver_mail(
        delivery_settings,
        delivery_sessions,
        delivery_redis,
        smtp_sink,
        sender="mailroom@corp.test",
        subject="Rechnung Nr. 42 Ü 請求書",
    )
    assert outcome == Outcome.DELIVERED
    assert len(smtp_sink.handler.mails) == 1
