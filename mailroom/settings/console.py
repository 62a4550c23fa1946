"""Settings of the operators' console (``mailroom console``): address, sign-in and roles."""

from __future__ import annotations

from ipaddress import ip_network
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from mailroom.settings.base import StrictModel


class ConsoleSettings(StrictModel):
    """The web console: where it listens, how people sign in, who may act."""

    host: str = "127.0.0.1"
    port: int = Field(default=8090, ge=0, le=65535)
    #: The address people reach the console at (``https://mailroom.example.com``): the OIDC
    #: redirect is built from it. Empty: from each request's own address.
    public_url: str = ""
    #: ``oidc`` (OpenID Connect sign-in), ``proxy`` (a trusted reverse proxy names the user in a
    #: header) or ``dev`` (a name and a role typed in; only on a `mailroom dev` stack).
    auth: Literal["oidc", "proxy", "dev"] = "oidc"
    #: Key that signs the session cookie; required outside `mailroom dev`. Several replicas
    #: share one key.
    session_secret: SecretStr = SecretStr("")
    #: A session ends this long after sign-in, in seconds.
    session_max_age_s: int = Field(default=8 * 3600, gt=0)
    #: Cookies only over HTTPS (``Secure``); `mailroom dev` serves plain HTTP on loopback.
    secure_cookies: bool = True
    #: The OIDC issuer (its ``/.well-known/openid-configuration`` is read at the first sign-in).
    oidc_issuer: str = ""
    oidc_client_id: str = ""
    oidc_client_secret: SecretStr = SecretStr("")
    oidc_scopes: str = "openid email profile"
    #: The claim (OIDC) naming who acted, written to the audit trail; ``sub`` when it is absent.
    operator_claim: str = "email"
    #: The claim (OIDC) holding the user's groups or roles: a list, or one string.
    roles_claim: str = "groups"
    #: Groups that make a user an operator (may act) or a viewer (may only look); a user in
    #: neither is refused.
    operator_groups: list[str] = ["mailroom-operators"]
    viewer_groups: list[str] = ["mailroom-viewers"]
    #: ``proxy``: the header naming the user, and the one listing their groups (comma-separated).
    proxy_user_header: str = "X-Forwarded-User"
    proxy_groups_header: str = "X-Forwarded-Groups"
    #: ``proxy``: addresses or networks of the proxies whose headers are believed; a request
    #: from anywhere else is refused.
    trusted_proxies: list[str] = []
    #: Set by `mailroom dev` for its own stack: ``auth: dev`` is refused without it.
    dev_sign_in: bool = False
    #: Largest CSV or XLSX file shown as a table, in bytes; larger ones are a download.
    max_table_bytes: int = Field(default=5 * 1024 * 1024, gt=0)
    #: Rows shown of a table.
    max_table_rows: int = Field(default=200, gt=0)

    @field_validator("trusted_proxies")
    @classmethod
    def _check_networks(cls, proxies: list[str]) -> list[str]:
        """A mistyped address fails at load, not at the first request."""
        for proxy in proxies:
            try:
                ip_network(proxy, strict=False)
            except ValueError:
                raise ValueError(f"{proxy[:60]!r} is not an address or network") from None
        return proxies
