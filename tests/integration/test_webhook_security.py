"""Signed webhooks through the real deliverer, over HTTP to the dev sink that verifies them.

Real Postgres and Redis; the sink is ``mailroom.devtools.sinks.WebhookSink``, which
answers 401 with the reason to a missing, stale or forged signature.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mailroom.adapters.channels import ChannelOutbound, webhook
from mailroom.adapters.channels.webhook import WebhookChannel
from mailroom.adapters.redis import DeliveryRedis
from mailroom.delivery.deliver import Deliverer
from mailroom.delivery.locks import LockOwner
from mailroom.delivery.outcomes import Outcome
from mailroom.delivery.ports import Envelope
from mailroom.devtools.imap import self_signed_certificate
from mailroom.devtools.sinks import WebhookSink, new_secret
from mailroom.errors import ChannelUnavailable
from mailroom.settings import DeliverySettings, WebhookAccount
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


async def test_consecutive_deliveries_share_one_kept_alive_connection(
    start_sink, deliverer_for, delivery_sessions
):
    sink = start_sink(secrets=[OLD])
    ids = [await make_message(delivery_sessions, channel="webhook") for _ in range(3)]
    async with deliverer_for(sink, [OLD]) as deliverer:
        outcomes = [await deliverer.deliver(message_id) for message_id in ids]
    assert outcomes == [Outcome.DELIVERED] * 3
    assert len(sink.received) == 3
    assert sink.connections == 1


def test_a_sender_that_resets_its_kept_connection_is_not_a_sink_error(capsys):
    sink = WebhookSink().start()
    try:
        for error in (ConnectionResetError(104, "reset by peer"), ValueError("a real failure")):
            try:
                raise error
            except Exception:
                sink._server.handle_error(None, ("127.0.0.1", 1))
    finally:
        sink.stop()
    printed = capsys.readouterr().err
    assert "reset by peer" not in printed
    assert "ValueError: a real failure" in printed


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


# --- https to a checked address: the certificate is still checked against the name ----------


@pytest.fixture
def https_receiver(request, tmp_path) -> Iterator[tuple[int, Path, list[str]]]:
    """An https server on 127.0.0.1 whose certificate names ``request.param``: (port, CA, Hosts)."""
    cert_file, key_file = self_signed_certificate(tmp_path, request.param)
    hosts: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            hosts.append(self.headers.get("Host") or "")
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], cert_file, hosts
    server.shutdown()
    server.server_close()
    thread.join(5)


async def send_over_https(port: int, ca_file: Path) -> None:
    settings = DeliverySettings(
        webhook_accounts={"default": WebhookAccount(url=f"https://localhost:{port}/hook")},
        webhook_allowed_hosts=["localhost", "127.0.0.1"],
    )
    channel = WebhookChannel("default", settings)
    # NOTE: the only change to the channel: it trusts the test's certificate.
    channel.tls = ssl.create_default_context(cafile=ca_file)
    envelope = Envelope(7, "webhook", "default", "ops", "Invoice", "total 10", 1, 1)
    try:
        await channel.send(envelope)
    finally:
        await channel.aclose()


@pytest.mark.parametrize("https_receiver", ["localhost"], indirect=True)
async def test_https_goes_to_the_checked_address_and_the_certificate_names_the_host(
    https_receiver,
):
    port, ca_file, hosts = https_receiver
    await send_over_https(port, ca_file)
    assert hosts == [f"localhost:{port}"]


@pytest.mark.parametrize("https_receiver", ["elsewhere.test"], indirect=True)
async def test_a_certificate_for_another_name_is_refused(https_receiver):
    port, ca_file, hosts = https_receiver
    with pytest.raises(ChannelUnavailable, match="ConnectError"):
        await send_over_https(port, ca_file)
    assert hosts == []


async def test_a_refused_connect_goes_on_to_the_hosts_next_checked_address(
    http_receiver, monkeypatch
):
    # The name's first address takes no connection (nothing listens on 127.0.0.2 there).
    async def resolve(host: str, port: int) -> list:
        return [ipaddress.ip_address("127.0.0.2"), ipaddress.ip_address("127.0.0.1")]

    monkeypatch.setattr(webhook, "_resolve", resolve)
    settings = DeliverySettings(
        webhook_accounts={"default": WebhookAccount(url=f"http://localhost:{http_receiver.port}/")},
        webhook_allowed_hosts=["localhost", "127.0.0.0/8"],
        webhook_allow_http=True,
    )
    channel = WebhookChannel("default", settings)
    try:
        await channel.send(Envelope(7, "webhook", "default", "ops", "Invoice", "total", 1, 1))
    finally:
        await channel.aclose()
    [request] = http_receiver.requests
    assert request.headers["Host"] == f"localhost:{http_receiver.port}"


# A receiver whose certificate a private CA signed: the webhook client trusts the CAs that
# OpenSSL's default paths name, so SSL_CERT_FILE pointing at that CA's bundle is enough.
SEND_WITH_DEFAULT_TRUST = """
import asyncio, sys
from mailroom.adapters.channels.webhook import WebhookChannel
from mailroom.delivery.ports import Envelope
from mailroom.settings import DeliverySettings, WebhookAccount

async def main() -> None:
    port = int(sys.argv[1])
    settings = DeliverySettings(
        webhook_accounts={"default": WebhookAccount(url=f"https://localhost:{port}/hook")},
        webhook_allowed_hosts=["localhost", "127.0.0.1"],
    )
    channel = WebhookChannel("default", settings)
    try:
        await channel.send(Envelope(7, "webhook", "default", "ops", "Invoice", "total 10", 1, 1))
    finally:
        await channel.aclose()

asyncio.run(main())
"""


@pytest.mark.parametrize("https_receiver", ["localhost"], indirect=True)
@pytest.mark.parametrize("trust_the_ca", [True, False])
def test_a_private_ca_is_trusted_through_ssl_cert_file(https_receiver, trust_the_ca):
    port, ca_file, hosts = https_receiver
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAILROOM_", "SSL_CERT"))}
    if trust_the_ca:
        env["SSL_CERT_FILE"] = str(ca_file)
    done = subprocess.run(
        [sys.executable, "-c", SEND_WITH_DEFAULT_TRUST, str(port)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if trust_the_ca:
        assert done.returncode == 0, done.stderr
        assert hosts == [f"localhost:{port}"]
    else:
        assert done.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in done.stderr
        assert hosts == []
