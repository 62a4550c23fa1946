"""OAuth 2.0 SMTP login: the email channel sends through aiosmtpd with XOAUTH2 or OAUTHBEARER
and a token from a local token endpoint; a refused token is a clear refusal and is not reused."""

from __future__ import annotations

from typing import Any

import pytest

from mailroom.adapters import oauth
from mailroom.adapters.channels.email import EmailChannel
from mailroom.delivery.ports import Envelope
from mailroom.errors import ChannelRejected, OAuthTokenUnavailable
from mailroom.settings import DeliverySettings, EmailAccount
from tests.fixtures.oauth import OAuthSmtp, TokenEndpoint, TokenReply

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def own_token_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oauth, "TOKENS", oauth.TokenProvider())


def channel(smtp: OAuthSmtp, endpoint: TokenEndpoint, **overrides: Any) -> EmailChannel:
    account = EmailAccount(
        **{
            "host": "127.0.0.1",
            "port": smtp.port,
            "security": "plain",
            "username": "alerts@example.test",
            "auth": "xoauth2",
            "oauth": endpoint.oauth(grant="client_credentials", refresh_token=""),
            **overrides,
        }
    )
    return EmailChannel("oauth", DeliverySettings(email_accounts={"oauth": account}))


def envelope(message_id: int = 1) -> Envelope:
    return Envelope(
        message_id=message_id,
        chunk=1,
        chunks=1,
        channel="email",
        account="oauth",
        recipient="ops@example.com",
        subject="Invoice 42",
        body="total 10 EUR",
    )


@pytest.mark.parametrize("auth", ["xoauth2", "oauthbearer"])
async def test_email_is_sent_with_a_token_login(oauth_smtp, token_endpoint, auth):
    sender = channel(oauth_smtp, token_endpoint, auth=auth)

    await sender.send(envelope(1))
    await sender.send(envelope(2))

    assert len(oauth_smtp.handler.mails) == 2
    assert oauth_smtp.handler.logins == [(auth.upper(), "alerts@example.test")] * 2
    assert token_endpoint.requests == [
        {"grant_type": "client_credentials", "client_id": "mailroom-test"}
    ], "one token for both sends"


async def test_refused_token_is_rejected_clearly_and_fetched_anew(oauth_smtp, token_endpoint):
    sender = channel(oauth_smtp, token_endpoint)
    token_endpoint.valid = False

    with pytest.raises(ChannelRejected, match="SMTP 535"):
        await sender.send(envelope())
    assert oauth_smtp.handler.mails == []

    token_endpoint.valid = True
    await sender.send(envelope())
    assert len(oauth_smtp.handler.mails) == 1
    assert len(token_endpoint.requests) == 2, "the refused token was dropped"


async def test_token_endpoint_outage_is_retryable(oauth_smtp, token_endpoint):
    token_endpoint.script.append(TokenReply(502))

    with pytest.raises(OAuthTokenUnavailable, match="HTTP 502"):
        await channel(oauth_smtp, token_endpoint).send(envelope())
    assert oauth_smtp.handler.mails == []
