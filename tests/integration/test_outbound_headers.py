"""What a webhook receiver sees of Mailroom's own machinery: no Sentry tracing headers.

Real Postgres, Redis and deliverer; the receiver is a loopback HTTP server that records
every header. Sentry reports to an in-memory transport, initialised as a process would.
"""

from __future__ import annotations

import pytest
import sentry_sdk
from pydantic import SecretStr

from mailroom.adapters.channels import ChannelOutbound
from mailroom.adapters.redis import DeliveryRedis
from mailroom.delivery.deliver import Deliverer
from mailroom.delivery.locks import LockOwner
from mailroom.delivery.outcomes import Outcome
from mailroom.settings import SentrySettings, Settings, WebhookAccount
from tests.fixtures.delivery import make_message
from tests.sentry_events import capturing_sentry

pytestmark = pytest.mark.integration

#: Headers that would hand a third party our trace, Sentry public key, environment and release.
TRACING_HEADERS = {"sentry-trace", "baggage", "traceparent"}


async def deliver_under_sentry(sentry: SentrySettings, delivery_settings, sessions, redis, url):
    settings = delivery_settings.model_copy(
        update={"webhook_accounts": {"default": WebhookAccount(url=url)}}
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
    with capturing_sentry(Settings(sentry=sentry)):
        try:
            # As under the Dramatiq integration: the send runs inside a transaction.
            with sentry_sdk.start_transaction(op="queue.task", name="deliver_channel_messages"):
                return await deliverer.deliver(message_id)
        finally:
            await outbound.aclose()


@pytest.mark.parametrize("traces_sample_rate", [0.0, 1.0])
async def test_a_webhook_carries_no_tracing_headers_to_its_receiver(
    delivery_settings, delivery_sessions, delivery_redis, http_receiver, traces_sample_rate
):
    sentry = SentrySettings(
        dsn=SecretStr("https://public@sentry.invalid/1"),
        environment="production",
        traces_sample_rate=traces_sample_rate,
    )
    outcome = await deliver_under_sentry(
        sentry, delivery_settings, delivery_sessions, delivery_redis, http_receiver.url
    )
    assert outcome == Outcome.DELIVERED
    [request] = http_receiver.requests
    sent = {name.lower() for name in request.headers}
    assert "idempotency-key" in sent
    assert sent & TRACING_HEADERS == set()


async def test_only_a_listed_service_of_our_own_receives_the_tracing_headers(
    delivery_settings, delivery_sessions, delivery_redis, http_receiver
):
    sentry = SentrySettings(
        dsn=SecretStr("https://public@sentry.invalid/1"),
        trace_propagation_targets=[rf"^http://127\.0\.0\.1:{http_receiver.port}/"],
    )
    outcome = await deliver_under_sentry(
        sentry, delivery_settings, delivery_sessions, delivery_redis, http_receiver.url
    )
    assert outcome == Outcome.DELIVERED
    [request] = http_receiver.requests
    assert {"sentry-trace", "baggage"} <= {name.lower() for name in request.headers}
