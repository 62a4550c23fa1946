"""How a mailbox or an e-mail account logs in: ``auth`` and its OAuth 2.0 token settings.

Kept apart from ``mailroom.settings`` so the settings module stays readable; both
``MailboxSettings`` and ``EmailAccount`` use ``check_login``.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

#: ``password``: LOGIN / AUTH PLAIN with ``password``; ``xoauth2`` and ``oauthbearer``: SASL
#: with an OAuth 2.0 access token from ``oauth.token_url``.
AuthKind = Literal["password", "xoauth2", "oauthbearer"]


class OAuthSettings(BaseModel):
    """Where and how to get an access token (RFC 6749: client credentials or a refresh token)."""

    model_config = ConfigDict(extra="forbid")

    #: The token endpoint (``https://…``; ``http://`` only on loopback, for tests and dev).
    token_url: str = ""
    client_id: str = ""
    client_secret: SecretStr = SecretStr("")
    #: ``refresh_token`` (a user's mailbox: Microsoft 365, Gmail) or ``client_credentials``
    #: (an app's own access, Microsoft 365 app-only).
    grant: Literal["client_credentials", "refresh_token"] = "refresh_token"
    refresh_token: SecretStr = SecretStr("")
    #: Space-separated scopes, sent as given (empty: none sent).
    scope: str = ""
    #: A token is renewed this many seconds before its ``expires_in`` runs out.
    refresh_margin_s: float = Field(default=60.0, ge=0)
    #: Connect and read timeout of the token request, in seconds.
    timeout_s: float = Field(default=10.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> OAuthSettings:
        parts = urlsplit(self.token_url)
        if self.token_url and not (
            parts.scheme == "https"
            or (parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost", "::1"))
        ):
            raise ValueError(
                f"token_url {self.token_url[:100]!r} must be https:// (http:// only on loopback)"
            )
        if self.grant == "refresh_token" and self.token_url:
            if not self.refresh_token.get_secret_value():
                raise ValueError("grant 'refresh_token' needs refresh_token")
        return self


def check_login(
    where: str, auth: AuthKind, password: SecretStr | None, oauth: OAuthSettings | None
) -> None:
    """One clear line when ``auth`` lacks what it needs or is given what it would ignore.

    ``password`` is None when it was not given (a mailbox with ``auth: password`` needs one).
    """
    if auth == "password":
        if password is None:
            raise ValueError(f"{where}: auth 'password' needs password")
        if oauth is not None:
            raise ValueError(f"{where}: oauth is only used with auth 'xoauth2' or 'oauthbearer'")
        return
    if oauth is None or not oauth.token_url:
        raise ValueError(f"{where}: auth {auth!r} needs oauth.token_url")
    if not oauth.client_id:
        raise ValueError(f"{where}: auth {auth!r} needs oauth.client_id")
    if password is not None and password.get_secret_value():
        raise ValueError(f"{where}: auth {auth!r} uses a token, not password: drop password")
