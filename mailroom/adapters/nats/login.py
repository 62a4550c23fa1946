"""How a NATS client logs in and encrypts its link (settings -> nats-py options), and the one
line an operator reads when that fails."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import nats.errors

from mailroom.adapters.tls import client_context
from mailroom.errors import NatsAnonymousRefused, NatsLoginRefused, NatsUnavailable
from mailroom.redaction import mask_urls
from mailroom.settings import NatsSettings

#: URL schemes nats-py connects with: TCP ones or websocket ones, never mixed in one list.
TCP_SCHEMES = ("nats", "tls")
WEBSOCKET_SCHEMES = ("ws", "wss")


def server_urls(settings: NatsSettings) -> list[str]:
    """The servers to connect to, each checked, so a bad one fails in one line.

    nats-py fails on a URL it cannot parse with an error its own cleanup then hides
    (an ``AssertionError``); the check here names the setting instead.

    Raises:
        NatsUnavailable: a server URL is malformed, or the list mixes TCP and websocket.
    """
    setting = "nats.servers" if settings.servers else "nats.url"
    urls = settings.server_urls
    if not urls:
        raise NatsUnavailable(f"{setting} is empty: give at least one nats://host:port")
    for url in urls:
        problem = _url_problem(url)
        if problem:
            hint = "; give several servers as nats.servers" if "," in url else ""
            raise NatsUnavailable(
                f"{setting}: {mask_urls(url)!r} is not a NATS server URL ({problem}){hint}"
            )
    schemes = {urlsplit(url).scheme for url in urls}
    if not (schemes <= set(TCP_SCHEMES) or schemes <= set(WEBSOCKET_SCHEMES)):
        raise NatsUnavailable(f"{setting}: mixes websocket and nats/tls URLs; use one kind")
    return urls


def refuse_anonymous(settings: NatsSettings) -> None:
    """Raise ``NatsAnonymousRefused`` for a link without a login unless ``allow_anonymous``.

    Checked before every connection, so each process refuses at its start (exit 2, as for a
    refused login) and every command in one line.
    """
    refusal = settings.anonymous_refusal()
    if refusal is not None:
        raise NatsAnonymousRefused(refusal)


def _url_problem(url: str) -> str:
    """Why ``url`` is not ``scheme://[user@]host[:port]``, or empty when it is."""
    if "," in url or any(char.isspace() for char in url):
        return "one server per entry"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is no number
    except ValueError as exc:
        return str(exc)
    if parts.scheme not in TCP_SCHEMES + WEBSOCKET_SCHEMES:
        return "scheme must be nats://, tls://, ws:// or wss://"
    if not parts.hostname:
        return "no host"
    return ""


def connect_options(settings: NatsSettings) -> dict[str, Any]:
    """``nats.connect`` keyword arguments for the login and TLS that ``settings`` give."""
    options: dict[str, Any] = {}
    if settings.user:
        options["user"] = settings.user
        options["password"] = settings.password.get_secret_value()
    if settings.token.get_secret_value():
        options["token"] = settings.token.get_secret_value()
    if settings.nkey_seed_file is not None:
        options["nkeys_seed"] = str(settings.nkey_seed_file)
    if settings.creds_file is not None:
        options["user_credentials"] = str(settings.creds_file)
    if settings.tls.given or any(url.startswith("tls://") for url in settings.server_urls):
        options["tls"] = client_context(settings.tls)
    return options


def connect_error(
    settings: NatsSettings, exc: BaseException, seen: Sequence[BaseException] = ()
) -> NatsUnavailable:
    """One line: where, what failed (login, TLS, network) and which settings to check.

    ``exc`` ended the attempts; ``seen`` are the attempts' own errors, which say more (a
    refused login ends as "no servers"). The URLs' credentials are masked.
    """
    where = ", ".join(mask_urls(url) for url in settings.server_urls)
    errors = [*seen, exc]
    if any(is_login_refused(error) for error in errors):
        return NatsLoginRefused(
            f"connect {where}: NATS refused the login ({_login_kind(settings)}); "
            "check nats.user/password, token, nkey_seed_file or creds_file"
        )
    tls = next((error for error in errors if isinstance(error, ssl.SSLError)), None)
    if tls is not None:
        return NatsUnavailable(
            f"connect {where}: TLS failed ({type(tls).__name__}: {str(tls)[:200]}); "
            "check nats.tls.ca_file, cert_file and key_file"
        )
    return NatsUnavailable(f"connect {where}: {type(exc).__name__}")


def is_login_refused(error: BaseException) -> bool:
    """Whether ``error`` is the server refusing the credentials."""
    return isinstance(error, nats.errors.AuthorizationError) or (
        "authorization violation" in str(error).lower()
    )


def _login_kind(settings: NatsSettings) -> str:
    if settings.user:
        return f"user {settings.user!r}"
    if settings.token.get_secret_value():
        return "token"
    if settings.nkey_seed_file is not None:
        return "nkey"
    if settings.creds_file is not None:
        return "creds file"
    return "no credentials given"
