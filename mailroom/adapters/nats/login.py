"""How a NATS client logs in and encrypts its link (settings -> nats-py options), and the one
line an operator reads when that fails."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import Any

import nats.errors

from mailroom.adapters.tls import client_context
from mailroom.errors import NatsUnavailable
from mailroom.process.observability import scrub_text
from mailroom.settings import NatsSettings


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
    if settings.tls.given or settings.url.startswith("tls://"):
        options["tls"] = client_context(settings.tls)
    return options


def connect_error(
    settings: NatsSettings, exc: BaseException, seen: Sequence[BaseException] = ()
) -> NatsUnavailable:
    """One line: where, what failed (login, TLS, network) and which settings to check.

    ``exc`` ended the attempts; ``seen`` are the attempts' own errors, which say more (a
    refused login ends as "no servers"). The URL's password is masked.
    """
    where = scrub_text(settings.url, ())
    errors = [*seen, exc]
    if any(_is_login_refused(error) for error in errors):
        return NatsUnavailable(
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


def _is_login_refused(error: BaseException) -> bool:
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
