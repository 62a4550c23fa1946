"""`mailroom recognizer`: run the reference recognition service, or check a live one.

``check`` plays Mailroom's side against any recognition service (see
``mailroom.recognition.contract.conformance``): a table of rules with pass/fail, exit 1 on
any failure. It reads no database, only NATS and the object store.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import typer

from mailroom.cli import errors
from mailroom.errors import NatsConfigError, NatsUnavailable
from mailroom.recognition.contract.conformance import CheckRow, CheckTimeouts
from mailroom.redaction import mask_urls

if TYPE_CHECKING:
    # rich only for ``check``'s table: the recognizer process never draws one.
    from rich.table import Table

app = typer.Typer(
    invoke_without_command=True,
    help="Run the reference recognition service (dev, demo, tests), or check a live service.",
)


@app.callback()
def recognizer(ctx: typer.Context) -> None:
    """Run the reference recognition service (dev, demo, tests); `check` tests a live one."""
    if ctx.invoked_subcommand is not None:
        return
    from mailroom.adapters.nats.websocket import import_nats
    from mailroom.cli import start_service

    import_nats()  # before the recognizer imports nats-py: aiohttp only for a websocket link
    from mailroom.recognizer.pairing import real_mailbox_refusal
    from mailroom.recognizer.serve import run

    settings = start_service("recognizer")
    refusal = real_mailbox_refusal(settings)
    if refusal is not None:
        typer.echo(f"mailroom: recognizer: refusing to start: {refusal}", err=True)
        raise typer.Exit(errors.EXIT_CONFIG)
    raise typer.Exit(run(settings))


@app.command()
def check(
    nats_url: str | None = typer.Option(
        None,
        "--nats",
        metavar="URL",
        help="NATS server of the service (default: MAILROOM_NATS__URL).",
    ),
    ack_timeout_s: float = typer.Option(
        5.0, "--ack-timeout", min=0.1, help="Seconds from a request to its ack."
    ),
    result_timeout_s: float = typer.Option(
        15.0, "--result-timeout", min=0.1, help="Seconds from a request to its result."
    ),
    puback_timeout_s: float = typer.Option(
        10.0,
        "--puback-timeout",
        min=0.1,
        help="Seconds a service may wait for a PubAck before it publishes again.",
    ),
) -> None:
    """Check a live recognition service against the contract; exit 1 on any failed row.

    Samples go to the object store of MAILROOM_STORAGE__*, requests to the request subjects
    (with MAILROOM_NATS__SUBJECT_PREFIX); no database is used.
    """
    from mailroom.adapters.storage import build_store
    from mailroom.cli import load_settings
    from mailroom.recognition.contract.conformance import check_service

    settings = load_settings("cli")
    if nats_url:
        settings = settings.model_copy(
            update={"nats": settings.nats.model_copy(update={"url": nats_url, "servers": []})}
        )
    timeouts = CheckTimeouts(
        ack_s=ack_timeout_s, result_s=result_timeout_s, puback_s=puback_timeout_s
    )
    store = build_store(settings)
    try:
        rows = asyncio.run(check_service(settings, store=store, timeouts=timeouts))
    except NatsConfigError as exc:
        if errors.show_tracebacks:
            raise
        typer.echo(mask_urls(f"mailroom: recognizer check: {exc}"), err=True)
        raise typer.Exit(errors.EXIT_CONFIG) from None
    except NatsUnavailable as exc:
        if errors.show_tracebacks:
            raise
        line = mask_urls(f"mailroom: recognizer check: cannot reach NATS: {exc}")
        typer.echo(line, err=True)
        typer.echo("  Is it running? Check --nats (or MAILROOM_NATS__URL).", err=True)
        raise typer.Exit(errors.EXIT_UNAVAILABLE) from None
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    from rich.console import Console

    Console().print(render_rows(rows))
    failed = sum(not row.passed for row in rows)
    warned = sum(row.warned for row in rows)
    if warned and not failed:
        typer.echo(f"{warned} of {len(rows)} checks passed with a warning", err=True)
    if failed:
        typer.echo(f"{failed} of {len(rows)} checks failed", err=True)
        raise typer.Exit(1)


def render_rows(rows: list[CheckRow]) -> Table:
    from rich.table import Table

    table = Table(title="Recognition service conformance")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail")
    for row in rows:
        verdict = (
            "[red]FAIL[/]"
            if not row.passed
            else "[yellow]warn[/]"
            if row.warned
            else "[green]pass[/]"
        )
        table.add_row(row.name, verdict, row.detail)
    return table
