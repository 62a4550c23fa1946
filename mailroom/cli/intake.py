"""`mailroom intake …`: operator commands for the intake pipeline."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.cli import lifecycle
from mailroom.errors import PermanentError
from mailroom.settings import Settings

app = typer.Typer(no_args_is_help=True, help="Operate the intake pipeline.")

T = TypeVar("T")

#: Longest error text shown in a table cell, in characters.
ERROR_CHARS = 80


def _run(settings: Settings, use: Callable[[async_sessionmaker[AsyncSession]], Awaitable[T]]) -> T:
    from mailroom.db import create_engine, create_sessionmaker

    async def main() -> T:
        engine = create_engine(settings.database)
        try:
            return await use(create_sessionmaker(engine))
        finally:
            await engine.dispose()

    return asyncio.run(main())


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else ""


@app.command()
def status() -> None:
    """Show every mailbox cursor: position, lease, backoff and why it stopped."""
    from mailroom.intake.operations import list_cursors

    settings = Settings()
    views = _run(settings, list_cursors)
    table = Table(title="Mailbox cursors")
    for column in (
        "mailbox",
        "folder",
        "status",
        "uidvalidity",
        "last uid",
        "retries",
        "next retry",
        "lease until",
        "blocked at",
        "last error",
    ):
        table.add_column(column)
    seen = set()
    for view in views:
        seen.add((view.mailbox, view.folder))
        style = {"blocked": "bold red", "failed": "yellow", "processing": "cyan"}.get(view.status)
        blocked = ""
        if view.blocked_uid is not None:
            blocked = f"UID {view.blocked_uid} {view.blocked_message_id or ''}"
        table.add_row(
            escape(view.mailbox),
            escape(view.folder),
            view.status,
            str(view.uidvalidity or ""),
            str(view.last_uid),
            str(view.retry_count),
            _when(view.next_retry_at),
            _when(view.lease_until),
            escape(blocked[:ERROR_CHARS]),
            escape((view.last_error or "")[:ERROR_CHARS]),
            style=style,
        )
    for mailbox in settings.intake.mailboxes:
        if (mailbox.name, mailbox.folder) not in seen:
            state = "not polled yet" if mailbox.enabled else "disabled"
            table.add_row(escape(mailbox.name), escape(mailbox.folder), state, style="dim")
    Console().print(table)


def _fail(exc: PermanentError) -> None:
    Console(stderr=True).print(f"[red]error:[/red] {escape(str(exc))}")
    raise typer.Exit(1)


@app.command()
def unblock(
    mailbox: str = typer.Argument(..., help="Mailbox name, as configured."),
    folder: str = typer.Option(None, help="Only needed when the mailbox has several cursors."),
) -> None:
    """Let a blocked or backed-off mailbox retry at once, from the UID where it stopped."""
    from mailroom.intake.operations import unblock_mailbox

    settings = Settings()
    try:
        view = _run(settings, lambda s: unblock_mailbox(s, mailbox, folder=folder))
    except PermanentError as exc:
        _fail(exc)
        return
    typer.echo(f"unblocked {view.mailbox}/{view.folder}: next poll reads above UID {view.last_uid}")


@app.command()
def reset(
    mailbox: str = typer.Argument(..., help="Mailbox name, as configured."),
    uid: int = typer.Option(..., "--uid", help="The next poll reads mails above this UID."),
    folder: str = typer.Option(None, help="Only needed when the mailbox has several cursors."),
) -> None:
    """Move a mailbox cursor to ``--uid`` (skip a poison mail, or re-read; stored mails dedupe)."""
    from mailroom.intake.operations import reset_mailbox

    settings = Settings()
    try:
        view = _run(settings, lambda s: reset_mailbox(s, mailbox, uid=uid, folder=folder))
    except PermanentError as exc:
        _fail(exc)
        return
    typer.echo(f"reset {view.mailbox}/{view.folder}: next poll reads above UID {view.last_uid}")


# Erasure and legal hold of one mail.
app.command()(lifecycle.erase)
app.command()(lifecycle.hold)
app.command()(lifecycle.release)
