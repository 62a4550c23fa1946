"""``mailroom dev``: the one command that reaches the dev tooling (``mailroom.devtools``).

The tooling needs the project's dev dependencies and is not in the built wheel, so a
production install answers this command with one line instead of a traceback.
"""

from __future__ import annotations

import typer

from mailroom.settings import DEV_IMAP_PORT, DEV_SMTP_PORT, DEV_WEBHOOK_PORT

#: Exit status when the dev tooling is not installed.
EXIT_NO_DEV_TOOLING = 2


def dev(
    state_dir: str = typer.Option(None, help="Where the embedded servers keep their data."),
    seed: bool = typer.Option(
        True, help="Put sample mails into the dev IMAP inbox (once per state dir)."
    ),
    imap_port: int = typer.Option(DEV_IMAP_PORT, help="Port of the dev IMAP server."),
    webhook_port: int = typer.Option(DEV_WEBHOOK_PORT, help="Port of the local webhook sink."),
    smtp_port: int = typer.Option(DEV_SMTP_PORT, help="Port of the local SMTP sink."),
) -> None:
    """Run the whole system on embedded services; Ctrl+C stops everything."""
    try:
        from mailroom.devtools.dev import run_dev
    except ModuleNotFoundError as exc:
        typer.echo(
            f"mailroom dev: needs the project's dev dependencies (missing module {exc.name!r}); "
            "run it from a checkout with `uv run mailroom dev`",
            err=True,
        )
        raise typer.Exit(EXIT_NO_DEV_TOOLING) from None

    raise typer.Exit(
        run_dev(
            state_dir=state_dir,
            seed=seed,
            imap_port=imap_port,
            webhook_port=webhook_port,
            smtp_port=smtp_port,
        )
    )
