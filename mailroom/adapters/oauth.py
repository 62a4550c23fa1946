"""OAuth 2.0 access tokens for IMAP and SMTP logins (RFC 6749 over httpx).

A token is fetched from the configured token endpoint (client credentials or a refresh
token), cached per endpoint, client, grant, scope and refresh token until ``expires_in``
minus a margin, and fetched again after that or after a server refused it. IMAP and
SMTP log in from threads, so the cache is guarded by a lock per key: two logins that
need the same token make one request. Tokens and secrets are never logged.

Errors: an endpoint that cannot be reached, times out or answers 5xx/429 is
``OAuthTokenUnavailable`` (retryable); one that refuses the grant or the client
(``invalid_grant``, ``invalid_client``: 4xx) or answers without a token is
``OAuthTokenRefused`` (permanent, like a refused password).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mailroom.errors import OAuthTokenRefused, OAuthTokenUnavailable
from mailroom.settings.oauth import OAuthSettings

if TYPE_CHECKING:
    # Imported where a token is fetched: intake imports this module for every IMAP login,
    # and httpx (with the click and rich its command line pulls in) costs about 0.1 s of CPU
    # at start-up in processes whose mailboxes log in with a password.
    import httpx

logger = logging.getLogger(__name__)

#: Lifetime assumed when the endpoint names none (RFC 6749 makes expires_in optional).
DEFAULT_EXPIRES_S = 3600.0


@dataclass(frozen=True)
class _Key:
    token_url: str
    client_id: str
    grant: str
    scope: str
    #: A digest, not the refresh token: two users of one client get two tokens.
    refresh_digest: str


@dataclass
class _Token:
    access_token: str
    renew_at: float


def _key(oauth: OAuthSettings) -> _Key:
    refresh = oauth.refresh_token.get_secret_value().encode()
    return _Key(
        oauth.token_url,
        oauth.client_id,
        oauth.grant,
        oauth.scope,
        hashlib.sha256(refresh).hexdigest() if refresh else "",
    )


class TokenProvider:
    """Access tokens per OAuth setting, cached until shortly before they expire."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._clock = clock
        self._transport = transport
        self._tokens: dict[_Key, _Token] = {}
        self._locks: dict[_Key, threading.Lock] = {}
        # A refresh token the endpoint rotated (sent a new one with the access token).
        self._rotated: dict[_Key, str] = {}
        self._guard = threading.Lock()

    def _lock(self, key: _Key) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def token(self, oauth: OAuthSettings) -> str:
        """A valid access token (blocking: call it in a thread, or use ``token_async``)."""
        key = _key(oauth)
        with self._lock(key):
            cached = self._tokens.get(key)
            if cached is not None and self._clock() < cached.renew_at:
                return cached.access_token
            fresh = self._fetch(oauth, key)
            self._tokens[key] = fresh
            return fresh.access_token

    async def token_async(self, oauth: OAuthSettings) -> str:
        return await asyncio.to_thread(self.token, oauth)

    def invalidate(self, oauth: OAuthSettings, access_token: str) -> None:
        """Forget ``access_token`` (a server refused it); a newer token is kept."""
        key = _key(oauth)
        with self._lock(key):
            cached = self._tokens.get(key)
            if cached is not None and cached.access_token == access_token:
                del self._tokens[key]

    def _fetch(self, oauth: OAuthSettings, key: _Key) -> _Token:
        form = {"grant_type": oauth.grant, "client_id": oauth.client_id}
        if oauth.client_secret.get_secret_value():
            form["client_secret"] = oauth.client_secret.get_secret_value()
        if oauth.grant == "refresh_token":
            form["refresh_token"] = self._rotated.get(key) or oauth.refresh_token.get_secret_value()
        if oauth.scope:
            form["scope"] = oauth.scope
        where = f"token endpoint {oauth.token_url[:100]!r}"
        started = self._clock()
        import httpx

        try:
            with httpx.Client(timeout=oauth.timeout_s, transport=self._transport) as client:
                response = client.post(
                    oauth.token_url, data=form, headers={"Accept": "application/json"}
                )
        except httpx.HTTPError as exc:
            raise OAuthTokenUnavailable(f"{where}: {type(exc).__name__}: {exc}") from None
        if response.status_code >= 500 or response.status_code == 429:
            raise OAuthTokenUnavailable(f"{where}: HTTP {response.status_code}")
        body = _json(response)
        if response.status_code >= 400:
            error = str(body.get("error") or f"HTTP {response.status_code}")[:100]
            detail = str(body.get("error_description") or "")[:200]
            raise OAuthTokenRefused(
                f"{where} refused the {oauth.grant} grant of client {oauth.client_id[:100]!r}: "
                f"{error}{': ' + detail if detail else ''}"
            )
        access_token = body.get("access_token")
        if not isinstance(access_token, str) or not access_token:
            raise OAuthTokenRefused(f"{where}: HTTP {response.status_code} without access_token")
        rotated = body.get("refresh_token")
        if isinstance(rotated, str) and rotated:
            self._rotated[key] = rotated
        expires_s = _expires_s(body.get("expires_in"))
        logger.info(
            "OAuth token for client %s fetched (expires in %ds)", oauth.client_id, expires_s
        )
        return _Token(access_token, started + max(0.0, expires_s - oauth.refresh_margin_s))


def _json(response: httpx.Response) -> dict[str, object]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _expires_s(value: object) -> float:
    try:
        return float(value) if value is not None else DEFAULT_EXPIRES_S  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return DEFAULT_EXPIRES_S


#: The process's tokens, shared by every IMAP connection and SMTP send.
TOKENS = TokenProvider()


def sasl_string(mechanism: str, user: str, access_token: str) -> str:
    """The initial client response of XOAUTH2 or OAUTHBEARER (RFC 7628) for ``user``."""
    if mechanism == "OAUTHBEARER":
        identity = user.replace("=", "=3D").replace(",", "=2C")
        return f"n,a={identity},\x01auth=Bearer {access_token}\x01\x01"
    return f"user={user}\x01auth=Bearer {access_token}\x01\x01"
