"""`mailroom intake …`: operator commands for the intake pipeline."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.cli import lifecycle
from mailroom.errors import AppError, CursorBusy, PermanentError
from mailroom.settings import Settings

if TYPE_CHECKING:
    from mailroom.intake.operations import CursorView

app = typer.Typer(no_args_is_help=True, help="Operate the intake pipeline.")

T = TypeVar("T")

#: Longest error text shown in a table cell, in characters.
ERROR_CHARS = 80


def _run(settings: Settings, use: Callable[[async_sessionmaker[AsyncSession]], Awaitable[T]]) -> T:
    from mailroom.db.engine import create_engine, create_sessionmaker

    async def main() -> T:
        engine = create_engine(settings.database)
        try:
            return await use(create_sessionmaker(engine))
        finally:
            await engine.dispose()

    return asyncio.run(main())


def _when(value: datetime | None) -> str:
    return value.strftime("%m-%d %H:%M:%S") if value else ""


@app.command()
def status() -> None:
    """Show every mailbox cursor: position, retries, lease or next try, and why it stopped."""
    from mailroom.config_store import effective
    from mailroom.intake.operations import list_cursors

    settings = Settings()
    key = settings.runtime_config.key.get_secret_value()

    async def cursors_and_mailboxes(sessions: async_sessionmaker[AsyncSession]) -> Any:
        # The mailboxes of the environment and of the runtime table, as the poller sees them.
        intake = await effective.intake_settings(sessions, settings.intake, key)
        return await list_cursors(sessions), intake.mailboxes

    views, mailboxes = _run(settings, cursors_and_mailboxes)
    # Few, short columns: readable at 80 columns; the problem cell wraps.
    table = Table(title="Mailbox cursors", box=box.SIMPLE_HEAD)
    table.add_column("mailbox/folder")
    table.add_column("status")
    table.add_column("last uid", justify="right")
    table.add_column("tries", justify="right")
    table.add_column("until")
    table.add_column("stopped at, error")
    seen = set()
    for view in views:
        seen.add((view.mailbox, view.folder))
        style = {"blocked": "bold red", "failed": "yellow", "processing": "cyan"}.get(view.status)
        problem = ""
        if view.blocked_uid is not None:
            problem = f"UID {view.blocked_uid} {view.blocked_message_id or ''}".strip() + ": "
        elif view.blocked_reason is not None:
            problem = f"{view.blocked_reason}: "
        problem += view.last_error or ""
        until = view.lease_until if view.status == "processing" else view.next_retry_at
        table.add_row(
            escape(f"{view.mailbox}/{view.folder}"),
            view.status,
            str(view.last_uid),
            str(view.retry_count),
            _when(until),
            escape(problem[: 2 * ERROR_CHARS]),
            style=style,
        )
    for mailbox in mailboxes:
        if (mailbox.name, mailbox.folder) not in seen:
            state = "not polled yet" if mailbox.enabled else "disabled"
            table.add_row(escape(f"{mailbox.name}/{mailbox.folder}"), state, style="dim")
    console = Console()
    console.print(table)
    console.print("until: the poll's lease (processing) or the next try (failed)", style="dim")


def _fail(exc: AppError) -> None:
    Console(stderr=True).print(f"[red]error:[/red] {escape(str(exc))}")
    raise typer.Exit(1)


#: Wait between two tries at a cursor a poll holds, in seconds.
BUSY_RETRY_S = 0.5

_WAIT_HELP = (
    "While a poll holds the mailbox, wait this long for its batch to end "
    "(default: intake.lease_s); 0 refuses at once."
)


def _when_idle(
    settings: Settings,
    mailbox: str,
    wait_s: float | None,
    change: Callable[[async_sessionmaker[AsyncSession]], Awaitable[CursorView]],
) -> CursorView:
    """Apply ``change`` to the cursor; while a poll holds it, wait for the batch to end."""
    budget_s = settings.intake.lease_s if wait_s is None else wait_s

    async def use(sessions: async_sessionmaker[AsyncSession]) -> CursorView:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        told = False
        while True:
            try:
                return await change(sessions)
            except CursorBusy:
                if loop.time() >= deadline:
                    raise
                if not told:
                    typer.echo(
                        f"mailbox {mailbox!r} is being polled: waiting for its batch to end "
                        f"(up to {budget_s:g} s)",
                        err=True,
                    )
                    told = True
                await asyncio.sleep(BUSY_RETRY_S)

    return _run(settings, use)


@app.command()
def unblock(
    mailbox: str = typer.Argument(..., help="Mailbox name, as configured."),
    folder: str = typer.Option(None, help="Only needed when the mailbox has several cursors."),
    wait_s: float = typer.Option(None, "--wait-s", min=0, help=_WAIT_HELP),
) -> None:
    """Let a blocked or backed-off mailbox retry at once, from the UID where it stopped."""
    from mailroom.intake.operations import unblock_mailbox

    settings = Settings()
    try:
        view = _when_idle(
            settings, mailbox, wait_s, lambda s: unblock_mailbox(s, mailbox, folder=folder)
        )
    # A poll still holding the mailbox after the wait is told like a refusal: one line.
    except (PermanentError, CursorBusy) as exc:
        _fail(exc)
        return
    typer.echo(f"unblocked {view.mailbox}/{view.folder}: next poll reads above UID {view.last_uid}")


@app.command()
def reset(
    mailbox: str = typer.Argument(..., help="Mailbox name, as configured."),
    uid: int = typer.Option(..., "--uid", help="The next poll reads mails above this UID."),
    folder: str = typer.Option(None, help="Only needed when the mailbox has several cursors."),
    wait_s: float = typer.Option(None, "--wait-s", min=0, help=_WAIT_HELP),
) -> None:
    """Move a mailbox cursor to --uid: skip a poison mail, or read mails again (none twice)."""
    from mailroom.intake.operations import reset_mailbox

    settings = Settings()
    try:
        view = _when_idle(
            settings,
            mailbox,
            wait_s,
            lambda s: reset_mailbox(s, mailbox, uid=uid, folder=folder),
        )
    except (PermanentError, CursorBusy) as exc:
        _fail(exc)
        return
    typer.echo(f"reset {view.mailbox}/{view.folder}: next poll reads above UID {view.last_uid}")


# Erasure and legal hold of one mail.
app.command()(lifecycle.erase)
app.command()(lifecycle.export)
app.command()(lifecycle.hold)
app.command()(lifecycle.release)
