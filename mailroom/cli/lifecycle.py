"""`mailroom intake erase | hold | release`: erasure of one mail and its legal hold."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.adapters.storage import ObjectStore
from mailroom.errors import PermanentError
from mailroom.settings import Settings

T = TypeVar("T")

MAIL_ID = typer.Option(..., "--mail", help="The inbound mail's id (mailroom status, audit rows).")
OPERATOR = typer.Option(
    None, "--operator", help="Who asks, for the audit row (default: the OS user)."
)


def _run(
    settings: Settings,
    use: Callable[[async_sessionmaker[AsyncSession], ObjectStore], Awaitable[T]],
) -> T:
    from mailroom.adapters.storage import build_store
    from mailroom.db.engine import create_engine, create_sessionmaker

    async def main() -> T:
        engine = create_engine(settings.database)
        store = build_store(settings)
        try:
            return await use(create_sessionmaker(engine), store)
        finally:
            closer = getattr(store, "close", None)
            if closer is not None:
                closer()
            await engine.dispose()

    return asyncio.run(main())


def _operator(name: str | None) -> str:
    from mailroom.db.audit import operator_id

    return name or operator_id()


def _refuse(exc: PermanentError) -> None:
    Console(stderr=True).print(f"[red]error:[/red] {escape(str(exc))}")
    raise typer.Exit(1)


def erase(mail: int = MAIL_ID, operator: str | None = OPERATOR) -> None:
    """Erase one mail: its body, files, jobs, results, documents and notifications.

    Objects other mails share (same content) stay. A mail on legal hold is refused.
    """
    from mailroom.lifecycle.erase import erase_mail

    who = _operator(operator)
    try:
        report = _run(Settings(), lambda s, store: erase_mail(s, store, mail, operator=who))
    except PermanentError as exc:
        _refuse(exc)
        return
    if not report.erased:
        typer.echo(f"nothing to erase: no mail {mail} (erased already?)")
        return
    deletion = report.deletion
    typer.echo(
        f"erased mail {mail}: {report.files} file(s), {report.jobs} job(s), "
        f"{report.documents} document(s), {report.channel_messages} notification(s), "
        f"{deletion.deleted if deletion else 0} object(s) deleted, "
        f"{report.audit_rows_scrubbed} audit row(s) scrubbed"
    )
    if deletion and deletion.failed:
        typer.echo(
            f"{deletion.failed} object(s) could not be deleted now; the retention pass "
            "retries them",
            err=True,
        )


def _set_hold(mail: int, operator: str | None, *, held: bool) -> None:
    from mailroom.lifecycle.erase import set_legal_hold

    who = _operator(operator)
    try:
        changed = _run(Settings(), lambda s, _: set_legal_hold(s, mail, held=held, operator=who))
    except PermanentError as exc:
        _refuse(exc)
        return
    state = "on legal hold" if held else "released from legal hold"
    typer.echo(f"mail {mail} {state}" if changed else f"mail {mail} was already {state}")


def hold(mail: int = MAIL_ID, operator: str | None = OPERATOR) -> None:
    """Put a mail on legal hold: retention and erase leave it alone until released."""
    _set_hold(mail, operator, held=True)


def release(mail: int = MAIL_ID, operator: str | None = OPERATOR) -> None:
    """Release a mail's legal hold: retention and erase apply again."""
    _set_hold(mail, operator, held=False)
