"""Process setup shared by every entry point: logging, Sentry and the metrics endpoint.

Logs are text or JSON lines (``settings.log.format``, see ``mailroom.process.log_format``),
scrubbed of secrets either way.

Call ``setup_process`` first thing, before the broker is built: sentry-sdk's
Dramatiq integration patches the broker class when it is initialised.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from pydantic import BaseModel, SecretStr

from mailroom.redaction import REDACTED, scrub_text
from mailroom.settings import Settings

LOG_FORMAT = "%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s"

#: Keys whose values never leave the process (request data, extras, contexts).
#: Not every ``key``: an access key id, an object key or an idempotency key are identifiers.
SENSITIVE_KEYS = re.compile(
    r"pass|secret|token|auth|body|cookie|dsn|api_?key|private_?key|^key$", re.IGNORECASE
)

#: The pid that ran ``setup_process`` (a forked child runs it again).
_set_up_in: int | None = None


def setup_process(settings: Settings, *, process: str) -> None:
    """Configure logging, Sentry (when a DSN is set) and tags for ``process``, once.

    The first call in a process wins: a REPL or a test that imports ``actors`` after
    the CLI set the process up keeps the CLI's name (``import actors`` sets up a worker).
    """
    global _set_up_in
    if _set_up_in == os.getpid():
        return
    _set_up_in = os.getpid()
    configure_logging(settings, process=process)
    if settings.sentry.dsn is not None:
        init_sentry(settings, process=process)


def secret_values(settings: BaseModel) -> set[str]:
    """Every SecretStr value inside ``settings``, nested groups and lists included."""
    found: set[str] = set()

    def visit(value: Any) -> None:
        if isinstance(value, SecretStr):
            secret = value.get_secret_value()
            if secret:
                found.add(secret)
        elif isinstance(value, BaseModel):
            for name in type(value).model_fields:
                visit(getattr(value, name))
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, list | tuple | set):
            for item in value:
                visit(item)

    visit(settings)
    return found


def scrub(value: Any, secrets: frozenset[str]) -> Any:
    """A copy of an event fragment with secrets, URL passwords and bodies removed."""
    if isinstance(value, str):
        return scrub_text(value, secrets)
    if isinstance(value, dict):
        return {
            key: REDACTED
            if isinstance(key, str) and SENSITIVE_KEYS.search(key)
            else scrub(item, secrets)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [scrub(item, secrets) for item in value]
    return value


class SecretScrubber(logging.Filter):
    """Rewrites each record's final text without URL passwords and secret values."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = frozenset(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(map(_is_dramatiq_message, record.args)):
            record.args = tuple(_message_label(arg) for arg in record.args)
        message = record.getMessage()
        cleaned = scrub_text(message, self.secrets)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub_text(record.exc_text, self.secrets)
        return True


def _is_dramatiq_message(value: object) -> bool:
    return hasattr(value, "actor_name") and hasattr(value, "message_id")


def _message_label(value: object) -> object:
    """Dramatiq renders messages with their arguments; logs get the actor and id only."""
    if _is_dramatiq_message(value):
        return f"{value.actor_name}[{value.message_id}]"  # type: ignore[attr-defined]
    return value


def configure_logging(settings: Settings, *, process: str) -> None:
    """Level, format (text or JSON), process context and scrubbing on every root handler.

    Dramatiq's worker processes already have a root handler (writing to the pipe
    their parent reads) when they import the actors: ``basicConfig`` leaves it in
    place, so the format is set on whatever handlers the root has.
    """
    from mailroom.process.log_format import CurrentStderrHandler, JsonLogFormatter, ProcessName

    default = CurrentStderrHandler()
    default.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.basicConfig(level=settings.log.level, handlers=[default])
    logging.getLogger().setLevel(settings.log.level)
    for handler in logging.getLogger().handlers:
        for old in [f for f in handler.filters if isinstance(f, ProcessName)]:
            handler.removeFilter(old)
        handler.addFilter(ProcessName(process))
        if settings.log.format == "json":
            handler.setFormatter(JsonLogFormatter())
    install_log_scrubber(settings)


def install_log_scrubber(settings: Settings) -> SecretScrubber:
    """Scrub every handler of the root logger (so every line this process writes)."""
    scrubber = SecretScrubber(secret_values(settings))
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, SecretScrubber) for f in handler.filters):
            handler.addFilter(scrubber)
    return scrubber


def make_before_send(settings: Settings) -> Any:
    secrets = frozenset(secret_values(settings))

    def before_send(event: dict[str, Any], hint: dict[str, Any]) -> dict[str, Any] | None:
        # Actor arguments may carry mail text: keep the actor and ids, never the payload.
        extra = event.get("extra") or {}
        if isinstance(extra.get("dramatiq_message"), dict):
            extra["dramatiq_message"] = {
                k: v for k, v in extra["dramatiq_message"].items() if k not in ("args", "kwargs")
            }
        # Dramatiq's own log lines format messages with their arguments: keep the template only.
        logentry = event.get("logentry")
        if isinstance(logentry, dict) and str(event.get("logger", "")).startswith("dramatiq"):
            logentry["formatted"] = logentry.get("message")
            logentry.pop("params", None)
        return scrub(event, secrets)  # type: ignore[no-any-return]

    return before_send


def init_sentry(settings: Settings, *, process: str, transport: Any = None) -> None:
    import sentry_sdk
    from sentry_sdk.integrations.dramatiq import DramatiqIntegration
    from sentry_sdk.integrations.logging import LoggingIntegration, ignore_logger

    assert settings.sentry.dsn is not None
    options: dict[str, Any] = {}
    if transport is not None:
        options["transport"] = transport
    sentry_sdk.init(
        dsn=settings.sentry.dsn.get_secret_value(),
        environment=settings.sentry.environment,
        traces_sample_rate=settings.sentry.traces_sample_rate,
        # Sentry's default propagates to every URL: webhooks would hand receivers our trace.
        trace_propagation_targets=list(settings.sentry.trace_propagation_targets),
        include_local_variables=False,
        max_request_body_size="never",
        integrations=[
            DramatiqIntegration(),
            LoggingIntegration(level=logging.INFO, event_level=logging.ERROR),
        ],
        before_send=make_before_send(settings),
        before_breadcrumb=_scrub_breadcrumb(settings),
        **options,
    )
    # The global scope: every thread's events carry it, however its scope was forked.
    sentry_sdk.get_global_scope().set_tag("process", process)
    # The Dramatiq integration reports a failed message inside its scope (with its tags)
    # and actors.middleware.dead_letters the one given up; the worker's error line would be one more.
    ignore_logger("dramatiq.worker.WorkerThread")


def active_sentry() -> ModuleType | None:
    """``sentry_sdk`` when Sentry reports from this process, else None.

    Only ``init_sentry`` (a DSN is set) or a test imports it: without a DSN no process pays
    its import (about 0.1 s of CPU at start-up), and every call into it would do nothing.
    """
    sentry_sdk = sys.modules.get("sentry_sdk")
    if sentry_sdk is None or not sentry_sdk.get_client().is_active():
        return None
    return sentry_sdk


def _scrub_breadcrumb(settings: Settings) -> Any:
    secrets = frozenset(secret_values(settings))

    def before_breadcrumb(crumb: dict[str, Any], hint: dict[str, Any]) -> dict[str, Any] | None:
        return scrub(crumb, secrets)  # type: ignore[no-any-return]

    return before_breadcrumb


def start_metrics_server(settings: Settings) -> int | None:
    """Serve Prometheus metrics for bridges and the scheduler; returns the port, if any."""
    if not settings.metrics.port:
        return None
    from prometheus_client import start_http_server

    start_http_server(settings.metrics.port, addr=settings.metrics.host)
    return settings.metrics.port
