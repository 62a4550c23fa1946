"""OAuth settings checked at load, and the token cache over a scripted token endpoint."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
from pydantic import ValidationError

from mailroom.adapters.oauth import TokenProvider, sasl_string
from mailroom.errors import OAuthTokenRefused, OAuthTokenUnavailable
from mailroom.settings import EmailAccount, MailboxSettings
from mailroom.settings.oauth import OAuthSettings

OAUTH = {
    "token_url": "https://login.example.test/token",
    "client_id": "app",
    "client_secret": "s3cret",
    "refresh_token": "r-1",
}


def mailbox(**values: Any) -> MailboxSettings:
    return MailboxSettings(**{"name": "m", "host": "imap.example.test", "username": "u", **values})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"auth": "xoauth2"}, "mailbox 'm': auth 'xoauth2' needs oauth.token_url"),
        (
            {"auth": "oauthbearer", "oauth": {**OAUTH, "client_id": ""}},
            "auth 'oauthbearer' needs oauth.client_id",
        ),
        (
            {"auth": "xoauth2", "oauth": OAUTH, "password": "pw"},
            "auth 'xoauth2' uses a token, not password: drop password",
        ),
        ({"password": "pw", "oauth": OAUTH}, "oauth is only used with auth 'xoauth2'"),
        (
            {"auth": "xoauth2", "oauth": {**OAUTH, "refresh_token": ""}},
            "grant 'refresh_token' needs refresh_token",
        ),
        (
            {"auth": "xoauth2", "oauth": {**OAUTH, "token_url": "http://login.example.test/t"}},
            "must be https:// (http:// only on loopback)",
        ),
        ({"auth": "xoauth2", "oauth": {**OAUTH, "grant": "password"}}, "oauth.grant"),
    ],
)
def test_a_mailbox_login_is_checked_at_load(values, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        mailbox(**values)


def test_token_settings_keep_their_secrets():
    box = mailbox(auth="xoauth2", oauth={**OAUTH, "grant": "client_credentials", "scope": "x"})
    assert box.oauth is not None and box.password.get_secret_value() == ""
    assert "s3cret" not in repr(box) and "r-1" not in repr(box)


def test_an_email_account_token_login_needs_a_username():
    with pytest.raises(ValidationError, match="auth 'xoauth2' needs username"):
        EmailAccount(host="smtp.example.test", auth="xoauth2", oauth=OAUTH)
    account = EmailAccount(host="smtp.example.test", username="a", auth="xoauth2", oauth=OAUTH)
    assert account.oauth is not None


class Endpoint:
    """A scripted token endpoint behind httpx's MockTransport; records each form."""

    def __init__(self, *replies: httpx.Response) -> None:
        self.replies = list(replies)
        self.forms: list[dict[str, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.forms.append({k: v[0] for k, v in parse_qs(request.content.decode()).items()})
        return self.replies.pop(0)


def token(value: str, **extra: Any) -> httpx.Response:
    return httpx.Response(200, json={"access_token": value, "token_type": "Bearer", **extra})


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def provider(endpoint: Endpoint, clock: Clock | None = None) -> TokenProvider:
    return TokenProvider(clock=clock or Clock(), transport=httpx.MockTransport(endpoint))


def test_client_credentials_form_and_cache_until_the_margin():
    endpoint = Endpoint(token("a", expires_in=600), token("b", expires_in=600))
    clock = Clock()
    tokens = provider(endpoint, clock)
    settings = OAuthSettings(**{**OAUTH, "grant": "client_credentials", "scope": "mail.send"})

    assert tokens.token(settings) == "a"
    clock.now = 539.0
    assert tokens.token(settings) == "a"
    clock.now = 540.0  # 600 s minus the 60 s margin
    assert tokens.token(settings) == "b"
    assert endpoint.forms[0] == {
        "grant_type": "client_credentials",
        "client_id": "app",
        "client_secret": "s3cret",
        "scope": "mail.send",
    }


def test_a_rotated_refresh_token_is_used_next_and_users_get_their_own_tokens():
    endpoint = Endpoint(token("a", expires_in=0, refresh_token="r-2"), token("b"), token("c"))
    tokens = provider(endpoint)
    alice = OAuthSettings(**OAUTH)
    bob = OAuthSettings(**{**OAUTH, "refresh_token": "r-bob"})

    assert tokens.token(alice) == "a"
    assert tokens.token(alice) == "b", "expires_in 0: renewed at once"
    assert tokens.token(bob) == "c"
    assert [form["refresh_token"] for form in endpoint.forms] == ["r-1", "r-2", "r-bob"]


def test_invalidate_drops_only_the_refused_token():
    tokens = provider(Endpoint(token("a"), token("b")))
    settings = OAuthSettings(**OAUTH)
    assert tokens.token(settings) == "a"
    tokens.invalidate(settings, "stale")
    assert tokens.token(settings) == "a"
    tokens.invalidate(settings, "a")
    assert tokens.token(settings) == "b"


@pytest.mark.parametrize(
    ("reply", "error", "message"),
    [
        (
            httpx.Response(401, json={"error": "invalid_client"}),
            OAuthTokenRefused,
            "refused the refresh_token grant of client 'app': invalid_client",
        ),
        (httpx.Response(200, text="<html>"), OAuthTokenRefused, "without access_token"),
        (httpx.Response(429), OAuthTokenUnavailable, "HTTP 429"),
        (httpx.Response(500, text="oops"), OAuthTokenUnavailable, "HTTP 500"),
    ],
)
def test_endpoint_answers_map_to_errors(reply, error, message):
    with pytest.raises(error, match=message) as caught:
        provider(Endpoint(reply)).token(OAuthSettings(**OAUTH))
    assert "s3cret" not in str(caught.value) and "r-1" not in str(caught.value)


def test_an_unreachable_endpoint_is_retryable():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    tokens = TokenProvider(transport=httpx.MockTransport(refuse))
    with pytest.raises(OAuthTokenUnavailable, match="ConnectError"):
        tokens.token(OAuthSettings(**OAUTH))


def test_sasl_strings():
    assert sasl_string("XOAUTH2", "u@x", "t") == "user=u@x\x01auth=Bearer t\x01\x01"
    assert sasl_string("OAUTHBEARER", "a,b=c", "t") == "n,a=a=2Cb=3Dc,\x01auth=Bearer t\x01\x01"
