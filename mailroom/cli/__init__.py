"""The ``mailroom`` command: starts processes and runs operator commands.

The CLI is the one outer module that may reach every layer (actors, bridges,
scheduling); each operator area lives in its own module, named here and imported
only when its command runs (``mailroom.cli.lazy``): the processes started through
this CLI do not pay for the operator commands' imports.
"""

from __future__ import annotations

import os

import typer

from mailroom.cli import errors
from mailroom.cli.lazy import LazyGroup
from mailroom.process import dev_defaults, outage
from mailroom.settings import Settings


class MailroomCommands(LazyGroup):
    """The top-level commands, in the order ``mailroom --help`` lists them."""

    lazy_before = {"notify": "mailroom.cli.delivery:notify", "dev": "mailroom.cli.dev:dev"}
    lazy_after = {
        "intake": "mailroom.cli.intake:app",
        "recognition": "mailroom.cli.recognition:app",
        "recognizer": "mailroom.cli.recognizer:app",
        "nats": "mailroom.cli.nats_admin:app",
        "review": "mailroom.cli.review:app",
        "console": "mailroom.cli.console:console",
        "delivery": "mailroom.cli.delivery:app",
        "dead-letters": "mailroom.cli.dead_letters:app",
        "mailboxes": "mailroom.cli.runtime_config:mailboxes_app",
        "accounts": "mailroom.cli.runtime_config:accounts_app",
        "routes": "mailroom.cli.runtime_config:routes_app",
    }


# NOTE: tracebacks with locals would print URLs with their passwords.
#: What ``mailroom --help`` says (the module docstring is for developers).
USER_HELP = (
    "Mailroom reads mailboxes, has their attachments recognized and sends notifications. "
    "Start its processes (worker, bridge, scheduler, or dev for all of them on one machine) "
    "and look after the work: status, then intake, recognition, review and delivery."
)

app = errors.FriendlyTyper(
    cls=MailroomCommands,
    no_args_is_help=True,
    add_completion=False,
    help=USER_HELP,
    pretty_exceptions_show_locals=False,
)
bridge_app = typer.Typer(no_args_is_help=True, help="Long-running consumers that feed actors.")
app.add_typer(bridge_app, name="bridge")


@app.callback()
def _options(
    debug: bool = typer.Option(
        False, "--debug", help="Show the traceback of a failure instead of a one-line answer."
    ),
) -> None:
    errors.show_tracebacks = debug
    outage.show_tracebacks = debug
    dev_defaults.quiet = True


def load_settings(process: str) -> Settings:
    """Settings for this process, with logging (and Sentry) configured before any broker."""
    from mailroom.process.observability import setup_process

    settings = Settings()
    setup_process(settings, process=process)
    return settings


def start_service(process: str) -> Settings:
    """``load_settings`` for a long-running process, its garbage collector tuned first."""
    from mailroom.process import gc_policy

    gc_policy.tune()
    return load_settings(process)


@app.command()
def migrate() -> None:
    """Upgrade the database to the newest schema (alembic upgrade head), create the buckets.

    Runs one at a time per database (a Postgres advisory lock); a second run waits, then
    finds the schema at head.
    """
    from mailroom.db.engine import database_url
    from mailroom.db.migrate import upgrade
    from mailroom.errors import MigrationLockTimeout

    settings = load_settings("migrate")
    try:
        upgrade(database_url(settings.database))
    except MigrationLockTimeout as exc:
        typer.echo(f"mailroom: migrate: {exc}. Nothing was applied; try again.", err=True)
        raise typer.Exit(1) from None
    typer.echo("database is at head")
    _create_buckets(settings)
    if settings.runtime_config.seed:
        from mailroom.cli import runtime_config

        seeded = runtime_config.seed_from_settings(settings)
        if seeded.written:
            typer.echo(f"seeded from the environment: {', '.join(seeded.written)}")


def _create_buckets(settings: Settings) -> None:
    """Create every bucket the settings name (recognition services write into the results one)."""
    from mailroom.adapters.storage import create_buckets
    from mailroom.errors import AppError

    try:
        names, created = create_buckets(settings)
    except AppError as exc:
        typer.echo(f"mailroom: migrate: cannot create the buckets: {exc}", err=True)
        raise typer.Exit(1) from None
    made = f" (created {', '.join(created)})" if created else ""
    typer.echo(f"buckets ready: {', '.join(names)}{made}")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def worker(
    ctx: typer.Context,
    queues: list[str] = typer.Option(
        None, "--queues", "-Q", help="Queues to consume (default: all)."
    ),
    processes: int = typer.Option(2, "--processes", "-p"),
    threads: int = typer.Option(8, "--threads", "-t"),
) -> None:
    """Run the workers that do the pipelines' work (Dramatiq actors, logging as configured)."""
    # Dramatiq's main runs in this process (mailroom.process.dramatiq_main): exec'ing a fresh
    # interpreter imported pydantic and the settings a second time (about 0.4 s of CPU).
    args = ["actors", "-p", str(processes), "-t", str(threads)]
    if queues:
        args += ["--queues", *queues]
    args += list(ctx.args)
    settings = Settings()
    # NOTE: before anything imports dramatiq: its worker reads this when first imported, and
    # the forked worker processes inherit the module as it is.
    os.environ.setdefault("dramatiq_worker_timeout", str(settings.broker.worker_poll_ms))
    from mailroom.process.logins import EXIT_LOGIN_REFUSED, login_refusals

    refusals = login_refusals(settings)
    # The outbox and the recognition actors open a NATS link: no login, no start (login.py).
    anonymous = settings.nats.anonymous_refusal()
    refusals += [anonymous] if anonymous is not None else []
    for refusal in refusals:
        typer.echo(f"mailroom worker: cannot start: {refusal}", err=True)
    if refusals:
        raise typer.Exit(EXIT_LOGIN_REFUSED)
    broker = settings.broker
    if broker.prometheus:
        # Dramatiq's exporter runs in a process forked from its main process, which never
        # imports the actors: it finds its address only in the environment.
        os.environ["dramatiq_prom_host"] = broker.prometheus_host
        os.environ["dramatiq_prom_port"] = str(broker.prometheus_port)
        # Domain counters of the worker processes join Dramatiq's multiprocess exporter only
        # when prometheus-client sees the folder before it is first imported.
        from dramatiq.middleware.prometheus import DB_PATH

        os.makedirs(DB_PATH, exist_ok=True)
        os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", DB_PATH)
    from mailroom.process import dramatiq_main

    raise typer.Exit(dramatiq_main.main(args, settings=settings))


@bridge_app.command("nats")
def bridge_nats() -> None:
    """Feed recognition acks and results from NATS to the inbox actor."""
    settings = start_service("bridge-nats")
    from bridges.nats import run

    raise typer.Exit(run(settings))


@bridge_app.command("stream")
def bridge_stream() -> None:
    """Feed delivery entries from the Redis Stream to the delivery actor."""
    settings = start_service("bridge-stream")
    from bridges.stream import run

    raise typer.Exit(run(settings))


@bridge_app.command("imap")
def bridge_imap() -> None:
    """Watch the mailboxes (IMAP NOTIFY or IDLE) and send a poll when new mail comes."""
    settings = start_service("bridge-imap")
    from bridges.imap import run

    raise typer.Exit(run(settings))


@app.command()
def scheduler() -> None:
    """Run the periodic jobs; one leader at a time through a Postgres advisory lock."""
    settings = start_service("scheduler")
    from scheduling.runner import run

    raise typer.Exit(run(settings))


@app.command()
def status(
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """What needs an operator, the oldest item per stage, queues, streams and links, at a glance."""
    settings = load_settings("cli")
    from mailroom.cli.status import print_status

    print_status(settings, as_json=as_json)
