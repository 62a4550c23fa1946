"""Failures caused by the outside world, told in a line or two; the traceback is for ``--debug``.

A setting, a server or a login that is wrong is not a bug: the operator needs what
failed, where (variable, host and port) and what to try. ``describe`` turns such an
exception into that; ``FriendlyTyper`` prints it and exits 2 for configuration
errors, 1 for servers. Anything ``describe`` does not know keeps its traceback.
"""

from __future__ import annotations

import difflib
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError

from mailroom.redaction import mask_urls

#: Exit status of a configuration error (like a usage error).
EXIT_CONFIG = 2
#: Exit status of an unreachable server or a refused login.
EXIT_UNAVAILABLE = 1
#: Most validation errors shown; the rest are counted.
MAX_SHOWN = 5

#: Set by ``mailroom --debug``: let exceptions through with their traceback.
show_tracebacks = False


@dataclass(frozen=True)
class Failure:
    exit_code: int
    lines: list[str]


def describe(exc: BaseException) -> Failure | None:
    """The people's version of ``exc`` or of an exception it was raised from, if known."""
    for candidate in _chain(exc):
        failure = _describe_one(candidate)
        if failure is not None:
            return Failure(failure.exit_code, [mask_urls(line) for line in failure.lines])
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its causes and contexts, and the members of exception groups, outermost first."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)


def _describe_one(exc: BaseException) -> Failure | None:
    if isinstance(exc, ValidationError) and _is_settings_error(exc):
        return Failure(EXIT_CONFIG, _validation_lines(exc))
    if isinstance(exc, SettingsError):
        cause = f": {exc.__cause__}" if exc.__cause__ is not None else ""
        return Failure(EXIT_CONFIG, [f"mailroom: configuration error: {exc}{cause}"])
    for describer in (_postgres, _redis, _nats, _app_error):
        failure = describer(exc)
        if failure is not None:
            return failure
    if isinstance(exc, ConnectionError | TimeoutError | socket.gaierror):
        return _unavailable("cannot connect", str(exc) or type(exc).__name__, "the server URLs")
    return None


def _is_settings_error(exc: ValidationError) -> bool:
    from mailroom import settings

    model = getattr(settings, exc.title, None)
    return isinstance(model, type) and issubclass(model, settings.StrictModel | settings.Settings)


def _validation_lines(exc: ValidationError) -> list[str]:
    from mailroom.settings import Settings

    errors = exc.errors(include_url=False, include_input=False)
    # A misspelt key also makes the key it was meant to be "missing": name the typo alone.
    typos = [error for error in errors if error["type"] == "extra_forbidden"]
    shown = typos or errors
    whole = exc.title == Settings.__name__
    lines = []
    for error in shown[:MAX_SHOWN]:
        loc = error["loc"]
        if error["type"] == "extra_forbidden":
            path, key = ".".join(map(str, loc[:-1])), str(loc[-1])
            message = f"unknown key {key!r}" + (f" in {path}" if path else "")
            message += _did_you_mean(key, loc[:-1])
            variable = _variable(loc) if whole else None
        else:
            text = error["msg"].removeprefix("Value error, ")
            variable = _variable(_location(loc, text)) if whole else None
            text = _with_variables(text) if whole else text
            message = f"{'.'.join(map(str, loc))}: {text}" if loc else text
        prefix = f"{variable}: " if variable and variable not in message else ""
        lines.append(f"mailroom: configuration error: {prefix}{message}")
    if len(shown) > MAX_SHOWN:
        lines.append(f"mailroom: … and {len(shown) - MAX_SHOWN} more configuration errors")
    return lines


def _variable(loc: tuple[int | str, ...]) -> str | None:
    """The variable that supplied the value at ``loc``, or the one to set (none for the root)."""
    from mailroom.settings import variable_for
    from mailroom.settings.checks import variable_named

    return variable_for(loc) or (variable_named(loc) if loc else None)


def _location(loc: tuple[int | str, ...], message: str) -> tuple[int | str, ...]:
    from mailroom.settings import Settings
    from mailroom.settings.checks import location_of

    return location_of(Settings, loc, message)


def _with_variables(message: str) -> str:
    from mailroom.settings import Settings
    from mailroom.settings.checks import with_variables

    return with_variables(Settings, message)


def _did_you_mean(key: str, loc: tuple[int | str, ...]) -> str:
    from mailroom.settings import Settings
    from mailroom.settings.checks import keys_at

    close = difflib.get_close_matches(key, keys_at(Settings, loc), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unavailable(what: str, detail: str, variable: str, hint: str = "Is it running?") -> Failure:
    first = detail.strip().splitlines()[0] if detail.strip() else ""
    return Failure(
        EXIT_UNAVAILABLE,
        [f"mailroom: {what}: {first}", f"  {hint} Check {variable}; --debug shows the traceback."],
    )


def _configured(pick: Any) -> str:
    """`` (now VALUE)`` for one configured URL, or nothing when the settings do not load."""
    from mailroom.settings import Settings

    # Built again here rather than passed down: this runs only on the way out, after the
    # command's own Settings() succeeded, and keeps every command free of error plumbing.
    try:
        return f" (now {pick(Settings())})"
    except Exception:
        return ""


def _postgres(exc: BaseException) -> Failure | None:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is a product dependency
        return None
    if not isinstance(exc, psycopg.Error):
        return None
    variable = "MAILROOM_DATABASE__URL" + _configured(lambda s: s.database.url)
    detail = str(exc).removeprefix("connection failed: ")
    if isinstance(exc, psycopg.errors.UndefinedTable):
        return _unavailable(
            "the database has no Mailroom schema", detail, variable, "Run `mailroom migrate`."
        )
    if not isinstance(exc, psycopg.OperationalError):
        return None
    # Reached, but the statement waited too long: a lock held by another session, or the
    # statement timeout. "Cannot reach" would send the operator to the wrong place.
    if isinstance(exc, psycopg.errors.LockNotAvailable):
        return _unavailable(
            "a table is locked by another Postgres session",
            detail,
            variable,
            "Try again once it ends (see pg_stat_activity).",
        )
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return _unavailable("a Postgres statement timed out", detail, variable, "Try again.")
    from mailroom.process.logins import POSTGRES_LOGIN_REFUSED

    if POSTGRES_LOGIN_REFUSED.search(detail):
        return _unavailable(
            "Postgres refused the login", detail, variable, "Check the user and password."
        )
    if re.search(r"database .* does not exist", detail):
        return _unavailable("no such database", detail, variable, "Create it or fix the name.")
    return _unavailable("cannot reach Postgres", detail, variable)


def _redis(exc: BaseException) -> Failure | None:
    import redis.exceptions

    variable = "MAILROOM_REDIS__URL" + _configured(lambda s: s.redis.url)
    if isinstance(exc, redis.exceptions.AuthenticationError):
        return _unavailable("Redis refused the login", str(exc), variable, "Check the password.")
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        if "CERTIFICATE_VERIFY_FAILED" in str(exc):
            # Redis answered: its certificate is what failed, not the server being down.
            return _unavailable(
                "Redis's TLS certificate was not trusted",
                str(exc),
                "MAILROOM_REDIS__TLS__CA_FILE",
                "Check the CA that signs the server's certificate.",
            )
        return _unavailable("cannot reach Redis", str(exc), variable)
    return None


def _nats(exc: BaseException) -> Failure | None:
    import nats.errors

    from mailroom.errors import NatsUnavailable

    variable = "MAILROOM_NATS__URL or MAILROOM_NATS__SERVERS" + _configured(
        lambda s: ", ".join(s.nats.server_urls)
    )
    if isinstance(exc, nats.errors.AuthorizationError):
        return _unavailable("NATS refused the login", str(exc), variable, "Check the credentials.")
    if isinstance(exc, NatsUnavailable | nats.errors.NoServersError):
        return _unavailable("cannot reach NATS", str(exc) or type(exc).__name__, variable)
    return None


def _app_error(exc: BaseException) -> Failure | None:
    from mailroom.errors import (
        MailboxLoginRejected,
        MailboxUnavailable,
        OAuthTokenRefused,
        OAuthTokenUnavailable,
    )

    oauth_settings = "the oauth settings of MAILROOM_INTAKE__MAILBOXES or its e-mail accounts"
    if isinstance(exc, OAuthTokenRefused):
        return _unavailable(
            "the OAuth token endpoint refused the grant",
            str(exc),
            oauth_settings,
            "Check client_id, client_secret and refresh_token (a revoked grant needs a new one).",
        )
    if isinstance(exc, OAuthTokenUnavailable):
        return _unavailable("cannot get an OAuth token", str(exc), oauth_settings)
    if isinstance(exc, MailboxLoginRejected):
        return _unavailable(
            "the IMAP server refused the login",
            str(exc),
            "MAILROOM_INTAKE__MAILBOXES",
            "Check the mailbox's username and password.",
        )
    if isinstance(exc, MailboxUnavailable):
        return _unavailable("cannot reach the IMAP server", str(exc), "MAILROOM_INTAKE__MAILBOXES")
    return None


class FriendlyTyper(typer.Typer):
    """A Typer app that prints known failures in a line or two instead of a traceback."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except Exception as exc:
            failure = None if show_tracebacks else describe(exc)
            if failure is None:
                raise
            for line in failure.lines:
                typer.echo(line, err=True)
            raise SystemExit(failure.exit_code) from None
