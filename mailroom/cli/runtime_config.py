"""`mailroom mailboxes|accounts|routes add|list|show|disable|enable`: configuration at runtime.

Rows live in Postgres (``mailroom.config_store``); the poller, the deliverer and the
notifications read them while they run. ``show`` masks every secret. Each change is
audit-logged with the operator.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from mailroom.config_store import admin
from mailroom.config_store.seed import SeedResult, seed
from mailroom.db.audit import operator_id
from mailroom.db.engine import create_engine, create_sessionmaker, transaction
from mailroom.errors import RuntimeConfigInvalid
from mailroom.settings import Settings

T = TypeVar("T")

OPERATOR_OPTION = typer.Option(
    None, "--operator", help="Who is acting (recorded); default: the OS user."
)

_HELP = {
    "mailbox": (
        "IMAP mailboxes intake reads, kept in Postgres. The config is a MailboxSettings "
        "object (docs: Configuration, the reference); the poller sees a change within one poll "
        "interval."
    ),
    "account": (
        "Channel accounts (webhook:NAME, email:NAME) kept in Postgres. The config is a "
        "WebhookAccount or EmailAccount object; the deliverer uses a change from its next batch."
    ),
    "route": (
        "Notification routes kept in Postgres, by a name you choose (the environment's are "
        "settings-1, settings-2, ...). The config is a NotificationRoute object."
    ),
}

_NAME_HELP = {
    "mailbox": "The mailbox's name (what poll_mailbox is given).",
    "account": "channel:account, e.g. webhook:ops or email:alerts.",
    "route": "The route's name.",
}


def _run(settings: Settings, work: Callable[[Any], Awaitable[T]]) -> T:
    async def main() -> T:
        engine = create_engine(settings.database)
        try:
            async with transaction(create_sessionmaker(engine)) as session:
                return await work(session)
        finally:
            await engine.dispose()

    try:
        return asyncio.run(main())
    except RuntimeConfigInvalid as exc:
        typer.echo(f"mailroom: {exc}", err=True)
        raise typer.Exit(1) from None


def _read_config(config: str | None, values: list[str]) -> dict[str, Any]:
    """JSON from ``--config`` (text, @file, or - for stdin) plus each ``--set key=value``."""
    data: dict[str, Any] = {}
    if config:
        if config == "-":
            text = sys.stdin.read()
        elif config.startswith("@"):
            text = Path(config[1:]).read_text()
        else:
            text = config
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"not JSON: {exc}", param_hint="--config") from None
        if not isinstance(loaded, dict):
            raise typer.BadParameter("give a JSON object", param_hint="--config")
        data.update(loaded)
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r} is not key=value", param_hint="--set")
        try:
            data[key] = json.loads(raw)
        except json.JSONDecodeError:
            data[key] = raw  # a plain string needs no JSON quotes
    return data


def group(kind: str) -> typer.Typer:
    """The five commands of one kind of row."""
    app = typer.Typer(no_args_is_help=True, help=_HELP[kind])
    name_argument = typer.Argument(..., help=_NAME_HELP[kind])

    @app.command()
    def add(
        name: str = name_argument,
        config: str | None = typer.Option(
            None, "--config", help="The config as JSON, @FILE, or - to read it from stdin."
        ),
        values: list[str] = typer.Option(
            [], "--set", help="key=value (the value is JSON or a plain string); repeatable."
        ),
        replace: bool = typer.Option(False, "--replace", help="Replace an existing row."),
        operator: str | None = OPERATOR_OPTION,
    ) -> None:
        """Add (or with --replace change) one row; secrets are stored encrypted."""
        data = _read_config(config, values)
        settings, who = Settings(), operator or operator_id()

        async def act(session: Any) -> int:
            return await admin.add(
                session, settings, kind=kind, name=name, config=data, operator=who, replace=replace
            )

        version = _run(settings, act)
        typer.echo(f"{kind} {name} stored (version {version})")

    @app.command("list")
    def list_rows() -> None:
        """Every row of the table, enabled or not (the environment's entries once seeded)."""

        async def read(session: Any) -> list[admin.RowView]:
            return await admin.views(session, kind)

        items = _run(Settings(), read)
        if not items:
            typer.echo(f"no {kind} rows (mailroom migrate seeds the environment's)")
            return
        table = Table(box=None, pad_edge=False)
        for column in ("name", "enabled", "source", "version", "target"):
            table.add_column(column, overflow="fold")
        for item in items:
            table.add_row(
                item.name,
                "yes" if item.enabled else "no",
                item.source,
                str(item.version),
                admin.summary(item),
            )
        Console().print(table)

    @app.command()
    def show(name: str = name_argument) -> None:
        """One row with its config; secrets are masked."""

        async def read(session: Any) -> admin.RowView | None:
            return await admin.view(session, kind, name)

        item = _run(Settings(), read)
        if item is None:
            typer.echo(f"no {kind} {name!r}", err=True)
            raise typer.Exit(1)
        typer.echo(
            f"{kind} {item.name}: {'enabled' if item.enabled else 'disabled'}, "
            f"version {item.version}, source {item.source}, "
            f"changed by {item.updated_by} at {item.updated_at:%Y-%m-%d %H:%M:%S %Z}"
        )
        typer.echo(json.dumps(item.config, indent=2, sort_keys=True))

    def toggle(enabled: bool) -> Callable[..., None]:
        def command(name: str = name_argument, operator: str | None = OPERATOR_OPTION) -> None:
            who = operator or operator_id()

            async def act(session: Any) -> None:
                await admin.set_enabled(
                    session, kind=kind, name=name, enabled=enabled, operator=who
                )

            _run(Settings(), act)
            typer.echo(f"{kind} {name} {'enabled' if enabled else 'disabled'}")

        command.__doc__ = (
            "Use the row again." if enabled else "Stop using the row (kept; enable brings it back)."
        )
        return command

    app.command("disable")(toggle(False))
    app.command("enable")(toggle(True))
    return app


mailboxes_app = group("mailbox")
accounts_app = group("account")
routes_app = group("route")


def seed_from_settings(settings: Settings) -> SeedResult:
    """Copy the environment's mailboxes, accounts and routes into the table (``migrate``)."""

    async def main() -> SeedResult:
        engine = create_engine(settings.database)
        try:
            return await seed(create_sessionmaker(engine), settings)
        finally:
            await engine.dispose()

    return asyncio.run(main())
