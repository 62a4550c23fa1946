"""Channels against real receivers: webhook on a local HTTP server, email on aiosmtpd,
the Redis token bucket, and whole deliveries through ``ChannelOutbound``."""

from __future__ import annotations

import asyncio
import email
import json
from email import policy

import pytest

from mailroom.adapters.channels import ChannelOutbound
from mailroom.adapters.redis import DeliveryRedis
from mailroom.delivery.deliver import Deliverer
from mailroom.delivery.locks import LockOwner
from mailroom.delivery.outcomes import Outcome
from mailroom.delivery.ports import Envelope
from mailroom.devtools.stack import free_port
from mailroom.errors import (
    ChannelRejected,
    ChannelUnavailable,
    DeliveryDeferred,
    RateLimited,
    Throttled,
    UnknownAccount,
    UnknownChannel,
)
from mailroom.settings import EmailAccount, RateLimit, WebhookAccount
from mailroom.webhooks import verify
from tests.fixtures.delivery import HttpReply, load_message, make_message

pytestmark = pytest.mark.integration

SECRET = "whsec_" + "c2VjcmV0IG9mIHRoZSB3ZWJob29rIHRlc3Rz"


def envelope(message_id: int = 7, chunk: int = 1, chunks: int = 1, **values) -> Envelope:
    fields = {
        "channel": "webhook",
        "account": "default",
        "recipient": "ops@example.com",
        "subject": "Invoice 42",
        "body": "total 10 EUR",
    }
    fields.update(values)
    return Envelope(message_id=message_id, chunk=chunk, chunks=chunks, **fields)


@pytest.fixture
async def outbound(delivery_settings, delivery_redis, http_receiver, smtp_sink):
    settings = delivery_settings.model_copy(
        update={
            "webhook_accounts": {
                "default": WebhookAccount(url=http_receiver.url, timeout_s=0.5, secrets=[SECRET])
            },
            "email_accounts": {
                "default": EmailAccount(
                    host="127.0.0.1", port=smtp_sink.port, security="plain", timeout_s=2
                )
            },
        }
    )
    keys = DeliveryRedis(delivery_redis, stream_key=settings.stream_key)
    built = ChannelOutbound(settings, redis=keys)
    yield built
    await built.aclose()


@pytest.fixture
def deliverer(outbound, delivery_sessions, delivery_redis):
    settings = outbound.settings
    return Deliverer(
        sessions=delivery_sessions,
        redis=DeliveryRedis(delivery_redis, stream_key=settings.stream_key),
        outbound=outbound,
        settings=settings,
        owner=LockOwner("worker-a", started_at=1.0),
    )


async def test_webhook_posts_json_with_an_idempotency_key_per_chunk(outbound, http_receiver):
    await outbound.sender("webhook", "default")(envelope(message_id=7, chunk=2, chunks=3))
    [request] = http_receiver.requests
    assert request.headers["Idempotency-Key"] == "7:2"
    # Signed by the Standard Webhooks convention; the id is the idempotency key.
    raw = json.dumps(request.body, separators=(",", ":")).encode()
    assert verify(request.headers, raw, secrets=[SECRET]) == "7:2"
    assert request.body == {
        "message_id": 7,
        "chunk": 2,
        "chunks": 3,
        "recipient": "ops@example.com",
        "subject": "Invoice 42",
        "body": "total 10 EUR",
    }


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (HttpReply(429, {"Retry-After": "3"}), RateLimited),
        (HttpReply(429), ChannelUnavailable),
        (HttpReply(503), ChannelUnavailable),
        (HttpReply(404), ChannelRejected),
        (HttpReply(400), ChannelRejected),
        (HttpReply(200, delay_s=1.0), ChannelUnavailable),  # client timeout is 0.5 s
    ],
)
async def test_webhook_answers_map_to_error_kinds(outbound, http_receiver, reply, error):
    http_receiver.reply(reply)
    with pytest.raises(error):
        await outbound.sender("webhook", "default")(envelope())


async def test_webhook_429_carries_the_servers_delay(outbound, http_receiver):
    http_receiver.reply(HttpReply(429, {"Retry-After": "3"}))
    with pytest.raises(RateLimited) as caught:
        await outbound.sender("webhook", "default")(envelope())
    assert caught.value.retry_after_s == 3


async def test_webhook_connection_refused_is_retryable(delivery_settings):
    settings = delivery_settings.model_copy(
        update={"webhook_accounts": {"down": WebhookAccount(url=f"http://127.0.0.1:{free_port()}")}}
    )
    built = ChannelOutbound(settings)
    try:
        with pytest.raises(ChannelUnavailable):
            await built.sender("webhook", "down")(envelope())
    finally:
        await built.aclose()


async def test_unknown_channel_and_account_are_permanent(outbound):
    with pytest.raises(UnknownChannel):
        outbound.sender("carrier-pigeon", "default")
    with pytest.raises(UnknownAccount):
        outbound.sender("webhook", "nobody")
    assert outbound.is_idempotent("webhook") and not outbound.is_idempotent("email")


async def test_chains_are_cached_per_channel_and_account_until_invalidated(outbound):
    first = outbound.sender("webhook", "default")
    assert outbound.sender("webhook", "default") is first
    assert outbound.sender("log", "default") is not first
    await outbound.invalidate("webhook", "default")
    assert outbound.sender("webhook", "default") is not first


async def test_email_is_sent_with_a_stable_message_id(outbound, smtp_sink):
    await outbound.sender("email", "default")(
        envelope(channel="email", message_id=9, chunk=1, chunks=2)
    )
    [mail] = smtp_sink.handler.mails
    assert mail["to"] == ["ops@example.com"]
    parsed = email.message_from_string(mail["data"], policy=policy.default)
    assert parsed["Subject"] == "Invoice 42 (1/2)"
    assert parsed["Message-ID"] == "<mailroom.9.1@localhost>"
    assert parsed.get_content().strip() == "total 10 EUR"


@pytest.mark.parametrize(
    ("rcpt", "data", "error"),
    [
        ("450 Mailbox busy", None, ChannelUnavailable),
        ("550 No such user", None, ChannelRejected),
        (None, "451 Local error", ChannelUnavailable),
        (None, "554 Transaction failed", ChannelRejected),
    ],
)
async def test_smtp_refusal_codes_map_to_retryable_or_permanent(
    outbound, smtp_sink, rcpt, data, error
):
    if rcpt:
        smtp_sink.handler.rcpt_replies.append(rcpt)
    if data:
        smtp_sink.handler.data_replies.append(data)
    with pytest.raises(error):
        await outbound.sender("email", "default")(envelope(channel="email"))
    assert smtp_sink.handler.mails == []


async def test_smtp_server_down_is_retryable(delivery_settings):
    settings = delivery_settings.model_copy(
        update={
            "email_accounts": {
                "down": EmailAccount(
                    host="127.0.0.1", port=free_port(), security="plain", timeout_s=1
                )
            }
        }
    )
    built = ChannelOutbound(settings)
    with pytest.raises(ChannelUnavailable):
        await built.sender("email", "down")(envelope(channel="email"))


async def test_rate_limit_middleware_uses_a_shared_token_bucket(delivery_settings, delivery_redis):
    settings = delivery_settings.model_copy(
        update={"rate_limits": {"log:default": RateLimit(per_second=1, burst=2)}}
    )
    keys = DeliveryRedis(delivery_redis, stream_key=settings.stream_key)
    # Two processes' chains share the bucket in Redis.
    first, second = ChannelOutbound(settings, redis=keys), ChannelOutbound(settings, redis=keys)
    await first.sender("log", "default")(envelope(channel="log"))
    await second.sender("log", "default")(envelope(channel="log"))
    with pytest.raises(Throttled) as caught:
        await first.sender("log", "default")(envelope(channel="log"))
    assert 0 < caught.value.retry_after_s <= 1.0
    await asyncio.sleep(caught.value.retry_after_s + 0.05)
    await second.sender("log", "default")(envelope(channel="log"))
    # Other accounts are not limited.
    for _ in range(5):
        await first.sender("log", "other")(envelope(channel="log"))


async def test_throttled_delivery_is_deferred_without_spending_an_attempt(
    deliverer, delivery_settings, delivery_redis, delivery_sessions
):
    settings = deliverer.settings.model_copy(
        update={"rate_limits": {"log:default": RateLimit(per_second=1, burst=1)}}
    )
    keys = DeliveryRedis(delivery_redis, stream_key=settings.stream_key)
    throttled = Deliverer(
        sessions=delivery_sessions,
        redis=keys,
        outbound=ChannelOutbound(settings, redis=keys),
        settings=settings,
        owner=deliverer.owner,
    )
    first = await make_message(delivery_sessions)
    second = await make_message(delivery_sessions)
    assert await throttled.deliver(first) == Outcome.DELIVERED
    with pytest.raises(DeliveryDeferred) as caught:
        await throttled.deliver(second)
    assert 0 < caught.value.retry_after_ms <= 1_000
    row = await load_message(delivery_sessions, second)
    assert (row.status, row.attempts) == ("pending", 0)


async def test_webhook_delivery_5xx_then_success(deliverer, delivery_sessions, http_receiver):
    http_receiver.reply(HttpReply(502))
    message_id = await make_message(delivery_sessions, channel="webhook")
    with pytest.raises(DeliveryDeferred) as caught:
        await deliverer.deliver(message_id)
    await asyncio.sleep(caught.value.retry_after_ms / 1000)
    assert await deliverer.deliver(message_id) == Outcome.DELIVERED
    keys = [r.headers["Idempotency-Key"] for r in http_receiver.requests]
    assert keys == [f"{message_id}:1", f"{message_id}:1"]
    row = await load_message(delivery_sessions, message_id)
    assert (row.status, row.attempts, row.last_error) == ("delivered", 2, None)


async def test_webhook_delivery_429_is_retried_after_retry_after(
    deliverer, delivery_sessions, http_receiver
):
    http_receiver.reply(HttpReply(429, {"Retry-After": "2"}))
    message_id = await make_message(delivery_sessions, channel="webhook")
    with pytest.raises(DeliveryDeferred) as caught:
        await deliverer.deliver(message_id)
    assert caught.value.retry_after_ms == 2_000
    row = await load_message(delivery_sessions, message_id)
    assert row.status == "pending" and "429" in row.last_error


async def test_webhook_delivery_permanent_4xx_fails(deliverer, delivery_sessions, http_receiver):
    http_receiver.reply(HttpReply(422))
    message_id = await make_message(delivery_sessions, channel="webhook")
    assert await deliverer.deliver(message_id) == Outcome.FAILED
    assert await deliverer.deliver(message_id) == Outcome.SETTLED
    assert len(http_receiver.requests) == 1
    row = await load_message(delivery_sessions, message_id)
    assert row.status == "failed" and "422" in row.last_error


async def test_webhook_chunked_delivery_resumes_at_the_failed_chunk(
    deliverer, delivery_sessions, http_receiver
):
    deliverer.settings = deliverer.settings.model_copy(update={"chunk_size": 4})
    http_receiver.reply(HttpReply(200), HttpReply(200), HttpReply(500))
    message_id = await make_message(
        delivery_sessions, channel="webhook", body="aaaabbbbccccddddeeee"
    )
    with pytest.raises(DeliveryDeferred) as caught:
        await deliverer.deliver(message_id)
    await asyncio.sleep(caught.value.retry_after_ms / 1000)
    assert await deliverer.deliver(message_id) == Outcome.DELIVERED
    chunks = [r.body["chunk"] for r in http_receiver.requests]
    assert chunks == [1, 2, 3, 3, 4, 5]
    assert [r.body["body"] for r in http_receiver.requests[-3:]] == ["cccc", "dddd", "eeee"]


async def test_email_delivery_with_smtp_refusals(deliverer, delivery_sessions, smtp_sink):
    smtp_sink.handler.rcpt_replies.append("451 Try again later")
    retried = await make_message(delivery_sessions, channel="email")
    with pytest.raises(DeliveryDeferred) as caught:
        await deliverer.deliver(retried)
    await asyncio.sleep(caught.value.retry_after_ms / 1000)
    assert await deliverer.deliver(retried) == Outcome.DELIVERED
    smtp_sink.handler.data_replies.append("554 Message rejected")
    refused = await make_message(delivery_sessions, channel="email")
    assert await deliverer.deliver(refused) == Outcome.FAILED
    assert "554" in (await load_message(delivery_sessions, refused)).last_error
    assert len(smtp_sink.handler.mails) == 1


async def test_unknown_channel_or_account_fails_the_message(deliverer, delivery_sessions):
    no_channel = await make_message(delivery_sessions, channel="carrier-pigeon")
    no_account = await make_message(delivery_sessions, channel="webhook", account="nobody")
    assert await deliverer.deliver(no_channel) == Outcome.FAILED
    assert await deliverer.deliver(no_account) == Outcome.FAILED
    assert "carrier-pigeon" in (await load_message(delivery_sessions, no_channel)).last_error
    assert "nobody" in (await load_message(delivery_sessions, no_account)).last_error
