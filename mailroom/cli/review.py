"""`mailroom review …`: operators finish the files recognition could not.

``list`` shows NEEDS_CHECK and ERROR files and why; ``show`` one file with its
document, source object and every attempt; ``accept``, ``correct`` and ``rerun``
act on it (``mailroom/recognition/review/actions.py``), audit-logged with the operator.
"""

from __future__ import annotations

import asyncio
import textwrap
from enum import StrEnum
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from mailroom.cli.recognition import _nudge_publisher, _with_session
from mailroom.db.audit import operator_id
from mailroom.errors import ReviewConflict, ReviewRefused
from mailroom.recognition.review import actions as review
from mailroom.recognition.review import queries as review_queries
from mailroom.recognition.review.queries import ReviewFile, ReviewItem
from mailroom.settings import Settings

app = typer.Typer(no_args_is_help=True, help="Review documents recognition could not finish.")

#: Exit code of a refused action or a conflict with another operator.
EXIT_REFUSED = 1

#: Columns ``review list`` fills (a terminal's default width).
LIST_WIDTH = 80

OPERATOR_OPTION = typer.Option(
    None, "--operator", help="Who is acting (recorded); default: the OS user."
)


class ReviewStatus(StrEnum):
    NEEDS_CHECK = "NEEDS_CHECK"
    ERROR = "ERROR"


@app.command("list")
def list_files(
    limit: int = typer.Option(50, "--limit", min=1, help="Most files shown."),
    mailbox: str | None = typer.Option(None, "--mailbox", help="Only files of this mailbox."),
    file_status: ReviewStatus | None = typer.Option(None, "--status", help="Only this status."),
) -> None:
    """Files waiting for an operator (NEEDS_CHECK, ERROR), oldest first, and why."""
    statuses = (str(file_status),) if file_status else review_queries.REVIEWABLE

    async def read(session: Any) -> list[ReviewItem]:
        return await review_queries.list_review_items(
            session, limit=limit + 1, statuses=statuses, mailbox=mailbox
        )

    items = asyncio.run(_with_session(Settings(), read))
    if not items:
        typer.echo("nothing to review")
        return
    typer.echo("\n".join(render_list(items[:limit])))
    if len(items) > limit:
        typer.echo(f"more files wait; raise --limit (now {limit})")


@app.command()
def show(file_id: int = typer.Argument(..., help="The file's id (from 'review list').")) -> None:
    """One file: document type, fields with confidence, source object, every attempt."""
    settings = Settings()

    async def read(session: Any) -> ReviewFile | None:
        return await review_queries.show_review_file(
            session, file_id, settings=settings.recognition
        )

    found = asyncio.run(_with_session(settings, read))
    if found is None:
        typer.echo(f"file {file_id} does not exist", err=True)
        raise typer.Exit(EXIT_REFUSED)
    _render_file(found, _console())


@app.command()
def accept(
    file_id: int = typer.Argument(..., help="The file's id."),
    operator: str | None = OPERATOR_OPTION,
) -> None:
    """Accept the file's document as it is: the file becomes RECOGNIZED and is notified again."""
    settings, who = Settings(), operator or operator_id()

    async def act(session: Any) -> review.ReviewOutcome:
        return await review.accept_file(
            session, file_id, operator=who, settings=settings.recognition
        )

    _report(_run(settings, act), who)


@app.command()
def correct(
    file_id: int = typer.Argument(..., help="The file's id."),
    fields: list[str] = typer.Option(
        [], "--field", help="name=value; repeat for more fields. An empty value clears it."
    ),
    document_type: str | None = typer.Option(None, "--type", help="Set the document type."),
    operator: str | None = OPERATOR_OPTION,
) -> None:
    """Correct fields (a manual attempt): the file becomes RECOGNIZED and is notified again."""
    corrections = _parse_fields(fields)
    settings, who = Settings(), operator or operator_id()

    async def act(session: Any) -> review.ReviewOutcome:
        return await review.correct_file(
            session,
            file_id,
            corrections,
            operator=who,
            settings=settings.recognition,
            document_type=document_type,
        )

    _report(_run(settings, act), who)


@app.command()
def rerun(
    file_id: int = typer.Argument(..., help="The file's id."),
    reason: str = typer.Option("", "--reason", help="Recorded in the audit event."),
    operator: str | None = OPERATOR_OPTION,
) -> None:
    """Run recognition again as a new attempt (a replay), then nudge the publisher."""
    settings, who = Settings(), operator or operator_id()

    async def act(session: Any) -> Any:
        return await review.rerun_file(session, file_id, operator=who, reason=reason)

    replayed = _run(settings, act)
    typer.echo(
        f"file {file_id}: attempt {replayed.attempt} queued as job {replayed.new_job_id} by {who}"
    )
    _nudge_publisher()


def _parse_fields(fields: list[str]) -> dict[str, str]:
    corrections: dict[str, str] = {}
    for given in fields:
        name, sep, value = given.partition("=")
        if not sep or not name.strip():
            raise typer.BadParameter(f"{given[:60]!r} is not name=value", param_hint="--field")
        corrections[name.strip()] = value
    return corrections


def _run(settings: Settings, act: Any) -> Any:
    try:
        return asyncio.run(_with_session(settings, act))
    except ReviewConflict as exc:
        typer.echo(f"conflict: {exc}", err=True)
        raise typer.Exit(EXIT_REFUSED) from exc
    except ReviewRefused as exc:
        typer.echo(f"refused: {exc}", err=True)
        raise typer.Exit(EXIT_REFUSED) from exc


def _report(outcome: review.ReviewOutcome, who: str) -> None:
    typer.echo(
        f"file {outcome.file_id} {outcome.action} by {who}: {outcome.file_status} "
        f"(attempt {outcome.attempt}, document {outcome.document_id})"
    )
    if outcome.finalized_mail_ids:
        _nudge_notifications(outcome.finalized_mail_ids)


def render_list(items: list[ReviewItem], width: int = LIST_WIDTH) -> list[str]:
    """One line per file, its reasons wrapped below it: readable at 80 columns."""
    name_width = width - 37
    lines = [f"{'file':>8}  {'status':<11}  {'mailbox':<12}  name"]
    for item in items:
        name = item.name if len(item.name) <= name_width else item.name[: name_width - 1] + "…"
        lines.append(
            f"{item.file_id:>8}  {item.status:<11}  {_cut(item.mailbox or '-', 12):<12}  {name}"
        )
        lines += textwrap.wrap(
            "; ".join(_why(item)) or "no reason recorded",
            width=width,
            initial_indent=" " * 10,
            subsequent_indent=" " * 12,
            break_on_hyphens=False,
        )
    return lines


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _why(item: ReviewItem) -> list[str]:
    reasons = []
    document = item.document
    if document is not None:
        if document.missing:
            reasons.append(f"missing: {', '.join(document.missing)}")
        if document.low_confidence:
            reasons.append(f"low confidence: {', '.join(document.low_confidence)}")
        if document.unrecognized:
            reasons.append(f"unrecognized: {', '.join(document.unrecognized)}")
    if item.error_code:
        reasons.append(f"error: {item.error_code}")
    if not reasons and item.reason:
        reasons.append(item.reason[:200])
    return reasons


def _render_file(found: ReviewFile, console: Console) -> None:
    item = found.item
    console.print(f"File {item.file_id}: {item.name} ({item.status})")
    console.print(f"  mail {item.mail_id or '-'}, mailbox {item.mailbox or '-'}")
    source = f"s3://{found.bucket}/{found.key}" if found.bucket else "none"
    console.print(f"  source object: {source}", soft_wrap=True)
    if item.reason:
        console.print(f"  reason: {item.reason}")
    document = item.document
    if document is None:
        console.print("  no document yet")
    else:
        console.print(
            f"  document {document.document_id} (attempt {document.attempt}): "
            f"type {document.document_type}"
        )
        if found.required is None:
            required = "unknown document type"
        else:
            required = ", ".join(found.required) or "none"
        console.print(f"  required: {required}")
        for label, names in (
            ("missing", document.missing),
            ("low confidence", document.low_confidence),
            ("unrecognized", document.unrecognized),
        ):
            if names:
                console.print(f"  {label}: {', '.join(names)}")
        fields = Table(title="Fields")
        fields.add_column("field", overflow="fold")
        fields.add_column("value", ratio=1, overflow="fold")
        fields.add_column("confidence", justify="right", no_wrap=True)
        for name in sorted(document.fields):
            confidence = document.field_confidence.get(name)
            fields.add_row(
                name,
                _value(document.fields[name]),
                f"{confidence:.2f}" if isinstance(confidence, int | float) else "-",
            )
        console.print(fields)
    attempts = Table(title="Attempts (automatic and manual)")
    attempts.add_column("#", justify="right", no_wrap=True)
    attempts.add_column("kind", no_wrap=True)
    attempts.add_column("status", no_wrap=True)
    attempts.add_column("by", overflow="fold")
    attempts.add_column("finished (UTC)", no_wrap=True)
    attempts.add_column("error", ratio=1, overflow="fold")
    for attempt in found.attempts:
        finished = attempt.finished_at or attempt.requested_at
        attempts.add_row(
            f"{attempt.attempt}{'*' if attempt.current else ''}",
            attempt.kind,
            attempt.status,
            attempt.operator_id or attempt.service_name or "-",
            f"{finished:%Y-%m-%d %H:%M}",
            attempt.error_code or "",
        )
    console.print(attempts)
    console.print("  * the file's current attempt")


def _console() -> Console:
    # NOTE: names, reasons and values come from mails and services: never read them as markup.
    return Console(markup=False, highlight=False)


def _value(value: Any) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= 200 else text[:199] + "…"


def _nudge_notifications(mail_ids: list[int]) -> None:
    """Send the notification pass now; the scheduler's sweep catches up if the broker is down."""
    import dramatiq.errors
    import redis.exceptions

    from actors.notifications import notify_final_mails

    mails = ", ".join(map(str, mail_ids))
    try:
        notify_final_mails.send()
    except (dramatiq.errors.DramatiqError, redis.exceptions.RedisError, OSError) as exc:
        typer.echo(
            f"warning: mail {mails} is final again but the notifier was not nudged "
            f"({type(exc).__name__}); the scheduler's notification sweep will send it",
            err=True,
        )
        return
    typer.echo(f"mail {mails} final again: its notification is on its way")
