"""Channel accounts added, broken and disabled while the deliverer runs (real Postgres, Redis, HTTP)."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import text

from mailroom.adapters.channels import ChannelOutbound
from mailroom.adapters.redis import DeliveryRedis
from mailroom.config_store import admin
from mailroom.config_store.effective import RuntimeAccounts
from mailroom.config_store.secrets import Cipher
from mailroom.db.engine import transaction
from mailroom.delivery.deliver import Deliverer
from mailroom.delivery.locks import LockOwner
from mailroom.delivery.outcomes import Outcome
from mailroom.settings import RuntimeConfigSettings, Settings
from tests.fixtures.delivery import HttpReply, load_message, make_message

pytestmark = pytest.mark.integration

KEY = Fernet.generate_key().decode()
SECRET = "whsec_" + "c2VjcmV0IG9mIHRoZSB3ZWJob29rIHRlc3Rz"


@pytest.fixture
def settings(delivery_settings):
    return Settings(delivery=delivery_settings, runtime_config=RuntimeConfigSettings(key=KEY))


@pytest.fixture
async def deliverer(settings, delivery_sessions, delivery_redis):
    delivery = settings.delivery
    keys = DeliveryRedis(delivery_redis, stream_key=delivery.stream_key)
    outbound = ChannelOutbound(
        delivery, redis=keys, accounts=RuntimeAccounts(delivery_sessions, delivery, Cipher(KEY))
    )
    yield Deliverer(
        sessions=delivery_sessions,
        redis=keys,
        outbound=outbound,
        settings=delivery,
        owner=LockOwner("worker-a", started_at=1.0),
        refresh_accounts=outbound.refresh,
    )
    await outbound.aclose()


async def _operator(sessions, settings, action, **values):
    async with transaction(sessions) as session:
        if action == "add":
            await admin.add(session, settings, kind="account", operator="ops-1", **values)
        else:
            await admin.set_enabled(
                session, kind="account", operator="ops-1", enabled=action == "enable", **values
            )


async def _send(deliverer, sessions):
    message_id = await make_message(sessions, channel="webhook", account="ops")
    outcome = await deliverer.deliver(message_id)
    return outcome, await load_message(sessions, message_id)


async def test_an_account_added_is_used_by_the_next_message_and_a_broken_one_fails_it(
    deliverer, settings, delivery_sessions, http_receiver
):
    # No such account yet: the message fails at once, saying so.
    outcome, row = await _send(deliverer, delivery_sessions)
    assert (outcome, row.status, row.attempts) == (Outcome.FAILED, "failed", 1)
    assert "no webhook account 'ops'" in row.last_error

    # Added while the deliverer runs: the next message goes out through it, signed.
    await _operator(
        delivery_sessions,
        settings,
        "add",
        name="webhook:ops",
        config={"url": http_receiver.url, "timeout_s": 2, "secrets": [SECRET]},
    )
    outcome, row = await _send(deliverer, delivery_sessions)
    assert (outcome, row.status) == (Outcome.DELIVERED, "delivered")
    (request,) = http_receiver.requests
    assert request.body["message_id"] == row.id
    assert {name.lower() for name in request.headers} >= {"webhook-id", "webhook-signature"}

    # Broken behind the deliverer's back (a secret no key decrypts): fails permanently, why.
    async with transaction(delivery_sessions) as session:
        await session.execute(
            text(
                "UPDATE runtime_config SET config = jsonb_set(config, '{secrets,0}', "
                '\'{"$fernet": "gAAAAAbroken"}\'), '
                "version = nextval('runtime_config_version_seq') WHERE name = 'webhook:ops'"
            )
        )
    outcome, row = await _send(deliverer, delivery_sessions)
    assert (outcome, row.status, row.attempts) == (Outcome.FAILED, "failed", 1)
    assert "account 'webhook:ops' is broken" in row.last_error
    assert "does not decrypt" in row.last_error
    assert len(http_receiver.requests) == 1, "nothing sent through the broken account"

    # Replaced by the operator: it works again; disabled: its messages fail with that reason.
    await _operator(
        delivery_sessions,
        settings,
        "add",
        name="webhook:ops",
        config={"url": http_receiver.url, "timeout_s": 2},
        replace=True,
    )
    outcome, _ = await _send(deliverer, delivery_sessions)
    assert outcome == Outcome.DELIVERED
    await _operator(delivery_sessions, settings, "disable", name="webhook:ops")
    outcome, row = await _send(deliverer, delivery_sessions)
    assert (outcome, row.status) == (Outcome.FAILED, "failed")
    assert "account 'webhook:ops' is disabled" in row.last_error
    assert len(http_receiver.requests) == 2


async def test_provider_ids_are_kept_per_chunk_for_webhook_and_email(
    settings, delivery_sessions, delivery_redis, http_receiver, smtp_sink
):
    delivery = settings.delivery.model_copy(update={"chunk_size": 10})
    keys = DeliveryRedis(delivery_redis, stream_key=delivery.stream_key)
    outbound = ChannelOutbound(
        delivery, redis=keys, accounts=RuntimeAccounts(delivery_sessions, delivery, Cipher(KEY))
    )
    deliverer = Deliverer(
        sessions=delivery_sessions,
        redis=keys,
        outbound=outbound,
        settings=delivery,
        refresh_accounts=outbound.refresh,
    )
    await _operator(
        delivery_sessions, settings, "add", name="webhook:ops", config={"url": http_receiver.url}
    )
    await _operator(
        delivery_sessions,
        settings,
        "add",
        name="email:ops",
        config={
            "host": "127.0.0.1",
            "port": smtp_sink.port,
            "security": "plain",
            "sender": "m@example.com",
        },
    )
    http_receiver.reply(
        HttpReply(headers={"X-Message-Id": "p-1"}),
        HttpReply(),
        HttpReply(headers={"X-Message-Id": "p-3"}),
    )
    body = "123456789 123456789 12345"  # three chunks of at most 10
    try:
        hook = await make_message(delivery_sessions, channel="webhook", account="ops", body=body)
        mail = await make_message(delivery_sessions, channel="email", account="ops", body="short")
        assert await deliverer.deliver(hook) == Outcome.DELIVERED
        assert await deliverer.deliver(mail) == Outcome.DELIVERED
    finally:
        await outbound.aclose()
    hook_row = await load_message(delivery_sessions, hook)
    assert hook_row.chunks["total"] == 3
    assert hook_row.chunks["ids"] == {"1": "p-1", "3": "p-3"}
    mail_row = await load_message(delivery_sessions, mail)
    assert mail_row.chunks["ids"] == {"1": f"<mailroom.{mail}.1@example.com>"}
