"""Signed webhooks through the real deliverer, over HTTP to the dev sink that verifies them.

Real Postgres and Redis; the sink is ``mailroom.devtools.sinks.WebhookSink``, which
answers 401 with the reason to a missing, stale or forged signature.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager

import pytest

from mailroom.adapters.channels import ChannelOutbound
from mailroom.adapters.redis import DeliveryRedis
from mailroom.delivery.deliver import Deliverer, Outcome
from mailroom.delivery.locks import LockOwner
from mailroom.devtools.sinks import WebhookSink, new_secret
from mailroom.settings import WebhookAccount
from tests.fixtures.delivery import load_message, make_message

pytestmark = pytest.mark.integration

OLD, NEW = new_secret(), new_secret()


@pytest.fixture
def start_sink() -> Iterator[Callable[..., WebhookSink]]:
    sinks: list[WebhookSink] = []

    def start(**options) -> WebhookSink:
        sinks.append(WebhookSink(**options).start())
        return sinks[-1]

    yield start
    for sink in sinks:
        sink.stop()


@pytest.fixture
def deliverer_for(delivery_settings, delivery_sessions, delivery_redis):
    @asynccontextmanager
    async def build(sink: WebhookSink, secrets: list[str]) -> AsyncIterator[Deliverer]:
        account = WebhookAccount(url=sink.url, secrets=secrets)
        settings = delivery_settings.model_copy(update={"webhook_accounts": {"default": account}})
        keys = DeliveryRedis(delivery_redis, stream_key=settings.stream_key)
        outbound = ChannelOutbound(settings, redis=keys)
        try:
            yield Deliverer(
                sessions=delivery_sessions,
                redis=keys,
                outbound=outbound,
                settings=settings,
                owner=LockOwner("worker-a", started_at=1.0),
            )
        finally:
            await outbound.aclose()

    return build


async def deliver_one(deliverer_for, sessions, sink: WebhookSink, secrets: list[str]):
    message_id = await make_message(sessions, channel="webhook", subject="Invoice 42")
    async with deliverer_for(sink, secrets) as deliverer:
        outcome = await deliverer.deliver(message_id)
    return outcome, await load_message(sessions, message_id)


async def test_a_signed_request_is_verified_and_delivered(
    start_sink, deliverer_for, delivery_sessions
):
    sink = start_sink(secrets=[OLD])
    outcome, row = await deliver_one(deliverer_for, delivery_sessions, sink, [OLD])
    assert outcome == Outcome.DELIVERED
    assert [item.key for item in sink.received] == [f"{row.id}:1"]
    assert sink.rejected == []


async def test_a_request_arriving_ten_minutes_late_is_refused_as_stale(
    start_sink, deliverer_for, delivery_sessions
):
    # What a replay looks like to the receiver: a valid request whose signing time is long past.
    sink = start_sink(secrets=[OLD], clock=lambda: time.time() + 600)
    outcome, row = await deliver_one(deliverer_for, delivery_sessions, sink, [OLD])
    assert outcome == Outcome.FAILED
    assert row.status == "failed"
    assert "401" in row.last_error and "stale timestamp" in row.last_error
    assert sink.received == []


async def test_a_forged_signature_is_refused_and_fails_the_message_once(
    start_sink, deliverer_for, delivery_sessions
):
    sink = start_sink(secrets=[OLD])
    outcome, row = await deliver_one(deliverer_for, delivery_sessions, sink, [NEW])
    assert outcome == Outcome.FAILED
    assert (row.status, row.attempts) == ("failed", 1)
    assert "bad signature" in row.last_error
    assert sink.rejected == ["bad signature: no v1 signature matches an active secret"]


async def test_an_unsigned_request_is_refused(start_sink, deliverer_for, delivery_sessions):
    sink = start_sink(secrets=[OLD])
    outcome, row = await deliver_one(deliverer_for, delivery_sessions, sink, [])
    assert outcome == Outcome.FAILED
    assert "missing header" in row.last_error


@pytest.mark.parametrize("receiver", [[OLD], [NEW], [OLD, NEW]], ids=["old", "new", "both"])
async def test_during_rotation_a_sender_with_both_secrets_reaches_every_receiver(
    start_sink, deliverer_for, delivery_sessions, receiver
):
    sink = start_sink(secrets=receiver)
    outcome, _ = await deliver_one(deliverer_for, delivery_sessions, sink, [OLD, NEW])
    assert outcome == Outcome.DELIVERED
    assert len(sink.received) == 1


# --- Outbound allow-list -------------------------------------------------------------------


async def deliver_with(delivery_settings, sessions, redis, url: str, **delivery) -> tuple:
    """Deliver one webhook message to ``url`` with delivery settings changed by ``delivery``.

    ``model_copy`` skips the load checks, as settings built in code would: the send checks.
    """
    settings = delivery_settings.model_copy(
        update={"webhook_accounts": {"default": WebhookAccount(url=url)}, **delivery}
    )
    keys = DeliveryRedis(redis, stream_key=settings.stream_key)
    outbound = ChannelOutbound(settings, redis=keys)
    deliverer = Deliverer(
        sessions=sessions,
        redis=keys,
        outbound=outbound,
        settings=settings,
        owner=LockOwner("worker-a", started_at=1.0),
    )
    message_id = await make_message(sessions, channel="webhook")
    try:
        outcome = await deliverer.deliver(message_id)
    finally:
        await outbound.aclose()
    return outcome, await load_message(sessions, message_id)


async def test_a_listed_name_resolving_to_loopback_fails_once_with_the_reason(
    delivery_settings, delivery_sessions, delivery_redis, http_receiver
):
    # The name is listed, its address is not: what a DNS answer pointing inside looks like.
    url = f"http://localhost:{http_receiver.port}/hook"
    outcome, row = await deliver_with(
        delivery_settings,
        delivery_sessions,
        delivery_redis,
        url,
        webhook_allowed_hosts=["localhost"],
    )
    assert outcome == Outcome.FAILED
    assert (row.status, row.attempts) == ("failed", 1)
    assert "resolves to 127.0.0.1, which is not a public address" in row.last_error
    assert http_receiver.requests == []


async def test_a_listed_name_and_address_are_sent_to_the_checked_address_with_the_name(
    delivery_settings, delivery_sessions, delivery_redis, http_receiver
):
    url = f"http://localhost:{http_receiver.port}/hook"
    outcome, _ = await deliver_with(
        delivery_settings,
        delivery_sessions,
        delivery_redis,
        url,
        webhook_allowed_hosts=["localhost", "127.0.0.1", "::1"],
    )
    assert outcome == Outcome.DELIVERED
    [request] = http_receiver.requests
    assert request.headers["Host"] == f"localhost:{http_receiver.port}"


@pytest.mark.parametrize(
    ("delivery", "reason"),
    [
        ({"webhook_allowed_hosts": []}, "address 127.0.0.1 is not in"),
        ({"webhook_allow_http": False}, "plain http"),
    ],
    ids=["unlisted", "http"],
)
async def test_an_unlisted_or_plain_http_url_is_refused_at_send(
    delivery_settings, delivery_sessions, delivery_redis, http_receiver, delivery, reason
):
    outcome, row = await deliver_with(
        delivery_settings, delivery_sessions, delivery_redis, http_receiver.url, **delivery
    )
    assert outcome == Outcome.FAILED
    assert (row.status, row.attempts) == ("failed", 1)
    assert reason in row.last_error
    assert http_receiver.requests == []
