"""The email channel's STARTTLS, SSL and login against aiosmtpd with a throwaway certificate."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult

from mailroom.adapters.channels import ChannelOutbound
from mailroom.delivery.ports import Envelope
from mailroom.devtools.imap import self_signed_certificate
from mailroom.devtools.stack import free_port
from mailroom.errors import ChannelRejected
from mailroom.settings import DeliverySettings, EmailAccount
from tests.fixtures.delivery import SmtpSinkHandler

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (cert file, key file)."""
    return self_signed_certificate(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def trusted(certificate, monkeypatch) -> ssl.SSLContext:
    """Make the client's default context trust the certificate; the server's context."""
    cert_path, key_path = certificate
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_path))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert_path, key_path)
    return server


def authenticate(server, session, envelope, mechanism, auth_data) -> AuthResult:
    ok = auth_data.login == b"mailroom" and auth_data.password == b"s3cret"
    return AuthResult(success=ok, handled=False)


def start(handler, **kwargs) -> tuple[Controller, int]:
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port, **kwargs)
    controller.start()
    return controller, port


@pytest.fixture
def starttls_server(trusted) -> Iterator[tuple[SmtpSinkHandler, int]]:
    handler = SmtpSinkHandler()
    controller, port = start(
        handler,
        tls_context=trusted,
        require_starttls=True,
        authenticator=authenticate,
        auth_required=True,
    )
    yield handler, port
    controller.stop()


@pytest.fixture
def ssl_server(trusted) -> Iterator[tuple[SmtpSinkHandler, int]]:
    handler = SmtpSinkHandler()
    controller, port = start(handler, ssl_context=trusted)
    yield handler, port
    controller.stop()


def envelope() -> Envelope:
    return Envelope(3, "email", "tls", "ops@example.com", "Report", "all done", 1, 1)


async def send_with(account: EmailAccount) -> None:
    outbound = ChannelOutbound(DeliverySettings(email_accounts={"tls": account}))
    try:
        await outbound.sender("email", "tls")(envelope())
    finally:
        await outbound.aclose()


async def test_starttls_and_login(starttls_server):
    handler, port = starttls_server
    await send_with(
        EmailAccount(
            host="127.0.0.1",
            port=port,
            security="starttls",
            username="mailroom",
            password="s3cret",
            timeout_s=5,
        )
    )
    assert [mail["to"] for mail in handler.mails] == [["ops@example.com"]]


async def test_bad_credentials_are_permanent(starttls_server):
    handler, port = starttls_server
    with pytest.raises(ChannelRejected):
        await send_with(
            EmailAccount(
                host="127.0.0.1",
                port=port,
                security="starttls",
                username="mailroom",
                password="wrong",
                timeout_s=5,
            )
        )
    assert handler.mails == []


async def test_plain_connection_to_a_server_requiring_starttls_is_refused(starttls_server):
    handler, port = starttls_server
    with pytest.raises(ChannelRejected):
        await send_with(EmailAccount(host="127.0.0.1", port=port, security="plain", timeout_s=5))
    assert handler.mails == []


async def test_implicit_ssl(ssl_server):
    handler, port = ssl_server
    await send_with(EmailAccount(host="127.0.0.1", port=port, security="ssl", timeout_s=5))
    assert len(handler.mails) == 1
