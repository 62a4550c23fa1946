"""`mailroom intake erase | export | hold | release`: erasure, a sender's export, legal hold."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
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
ERASE_MAIL_ID = typer.Option(None, "--mail", help="One inbound mail's id.")
SENDER = typer.Option(
    None, "--sender", help="Every mail from this address (the From address, any case)."
)
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


def erase(
    mail: int | None = ERASE_MAIL_ID,
    sender: str | None = SENDER,
    operator: str | None = OPERATOR,
) -> None:
    """Erase one mail (--mail) or every mail from an address (--sender): body, files, jobs,
    results, documents, notifications, and their content in the audit trail.

    Objects other mails share (same content) stay. A mail on legal hold is refused (kept, with
    --sender). An erased mail is never read in again.
    """
    from mailroom.lifecycle.erase import erase_mail

    if (mail is None) == (sender is None):
        _refuse(PermanentError("give either --mail ID or --sender ADDRESS"))
        return
    who = _operator(operator)
    if sender is not None:
        _erase_sender(sender, who)
        return
    assert mail is not None
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
    _tell_failed(deletion.failed if deletion else 0)


def _tell_failed(failed: int) -> None:
    if failed:
        typer.echo(
            f"{failed} object(s) could not be deleted now; the retention pass retries them",
            err=True,
        )


def _erase_sender(sender: str, who: str) -> None:
    from mailroom.lifecycle.sender import erase_sender

    try:
        report = _run(Settings(), lambda s, store: erase_sender(s, store, sender, operator=who))
    except PermanentError as exc:
        _refuse(exc)
        return
    typer.echo(
        f"erased {report.mails} mail(s) from {sender}: {report.files} file(s), "
        f"{report.jobs} job(s), {report.documents} document(s), "
        f"{report.channel_messages} notification(s), {report.objects_deleted} object(s) "
        f"deleted, {report.audit_rows_scrubbed} audit row(s) scrubbed"
    )
    if report.held:
        held = ", ".join(str(i) for i in report.held)
        typer.echo(f"kept {len(report.held)} mail(s) on legal hold: {held}")
    _tell_failed(report.objects_failed)


def export(
    sender: str = typer.Option(..., "--sender", help="The data subject's address (any case)."),
    out: Path = typer.Option(..., "--out", help="The zip to write (replaced if it exists)."),
    operator: str | None = OPERATOR,
) -> None:
    """Export every mail from an address, its files, documents and notifications, as a zip
    with a manifest (a data subject's access request). Audit-logged; safe to run again."""
    from mailroom.lifecycle.export import export_sender

    who = _operator(operator)
    try:
        report = _run(
            Settings(), lambda s, store: export_sender(s, store, sender, out, operator=who)
        )
    except (PermanentError, OSError) as exc:
        _refuse(PermanentError(f"export to {out} failed: {exc}"))
        return
    typer.echo(
        f"exported {report.mails} mail(s) from {sender} to {report.path}: {report.files} "
        f"file(s), {report.documents} document(s), {report.notifications} notification(s)"
    )
    if report.missing_objects:
        typer.echo(
            f"{report.missing_objects} object(s) were not in the store (listed without content)"
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
