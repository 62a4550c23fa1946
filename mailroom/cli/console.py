"""``mailroom console``: serve the operators' console (``mailroom/console/``).

The console's actions nudge the workers by actor name through a sending broker, as the
bridges do: this process loads no actor module.
"""

from __future__ import annotations

import logging

import typer

from mailroom.settings import ConsoleSettings, Settings

logger = logging.getLogger(__name__)

#: Exit status of settings the console cannot start with.
EXIT_BAD_SETTINGS = 2


def startup_problem(console: ConsoleSettings) -> str | None:
    """What keeps the console from starting with these settings, in one line; None if nothing."""
    if console.auth == "dev" and not console.dev_sign_in:
        return (
            "console.auth is dev (sign-in without a password), which only `mailroom dev` "
            "allows; set MAILROOM_CONSOLE__AUTH to oidc or proxy"
        )
    if console.auth != "dev" and not console.session_secret.get_secret_value():
        return "set MAILROOM_CONSOLE__SESSION_SECRET (a long random text) to sign the sessions"
    if console.auth == "oidc" and not (console.oidc_issuer and console.oidc_client_id):
        return "console.auth is oidc: set MAILROOM_CONSOLE__OIDC_ISSUER and __OIDC_CLIENT_ID"
    if console.auth == "proxy" and not console.trusted_proxies:
        return "console.auth is proxy: list the proxies' addresses in console.trusted_proxies"
    return None


class BrokerNudges:
    """Send the outbox pass and the notification pass by name; a failed send is a warning."""

    def publish_requests(self) -> str | None:
        from mailroom import queues

        return self._send(queues.PUBLISH_RECOGNITION_REQUESTS)

    def notify_final_mails(self) -> str | None:
        from mailroom import queues

        return self._send(queues.NOTIFY_FINAL_MAILS)

    def _send(self, actor: object) -> str | None:
        import dramatiq.errors
        import redis.exceptions

        from actors.broker.transport import send

        try:
            send(actor)  # type: ignore[arg-type]
        except (dramatiq.errors.DramatiqError, redis.exceptions.RedisError, OSError) as exc:
            logger.warning("Nudge %s not sent (%s): the sweep will do it", actor, exc)
            return f"the workers were not nudged ({type(exc).__name__}); the scheduler's sweep will"
        return None


def console() -> None:
    """Serve the operators' console: review documents, see what needs a person, act on it."""
    from mailroom.cli import start_service

    settings: Settings = start_service("console")
    problem = startup_problem(settings.console)
    if problem:
        typer.echo(f"mailroom console: cannot start: {problem}", err=True)
        raise typer.Exit(EXIT_BAD_SETTINGS)
    import uvicorn

    from mailroom import queues
    from mailroom.console.app import build_app
    from mailroom.process.observability import start_metrics_server

    queues.only_send()
    from actors.broker.transport import set_sending_broker

    broker = set_sending_broker(settings)
    start_metrics_server(settings)
    where = settings.console
    typer.echo(f"console on http://{where.host}:{where.port} (sign-in: {where.auth})")
    try:
        uvicorn.run(
            build_app(settings, nudges=BrokerNudges()),
            host=where.host,
            port=where.port,
            log_config=None,
            proxy_headers=False,
            server_header=False,
        )
    finally:
        broker.close()
