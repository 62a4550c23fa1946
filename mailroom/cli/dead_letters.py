"""``mailroom dead-letters list|replay|purge``: Dramatiq's dead-letter queues on Redis.

The reading and replaying is ``mailroom/ops/dead_letters.py`` (the console uses it too);
every replay and purge here is audit-logged with the operator.
"""

from __future__ import annotations

import asyncio
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from mailroom.db.audit import OPERATOR, operator_id, record_audit_event
from mailroom.ops.dead_letters import (
    REASON_OPTION,
    list_dead_letters,
    purge_dead_letters,
    replay_dead_letters,
)
from mailroom.settings import Settings

__all__ = ["REASON_OPTION", "app"]

app = typer.Typer(no_args_is_help=True, help="Inspect, replay or purge Dramatiq dead letters.")


def _audit(settings: Settings, action: str, detail: dict[str, Any]) -> None:
    asyncio.run(
        record_audit_event(
            settings,
            actor_type=OPERATOR,
            actor_id=operator_id(),
            action=action,
            target="dramatiq.dead_letters",
            detail=detail,
        )
    )


@app.command("list")
def list_command(
    queue: str = typer.Option(None, help="One queue (e.g. delivery or delivery.DQ)."),
    limit: int = typer.Option(100, min=1),
) -> None:
    """Dead letters per queue: actor, message id, when, retries and the error (no arguments)."""
    letters = list_dead_letters(Settings(), queue=queue, limit=limit)
    table = Table(title=f"Dramatiq dead letters ({len(letters)})")
    for column in ("queue", "message id", "actor", "failed at", "retries", "error"):
        table.add_column(column)
    for letter in letters:
        table.add_row(
            letter.queue,
            letter.message_id,
            letter.actor_name,
            letter.failed_at.isoformat(timespec="seconds"),
            str(letter.retries),
            letter.error,
        )
    Console().print(table)


@app.command()
def replay(
    queue: str = typer.Option(None, help="Only this queue."),
    message_id: str = typer.Option(None, "--id", help="Only this message."),
    limit: int = typer.Option(100, min=1, help="Most messages to replay."),
    rate: float = typer.Option(50.0, min=0, help="Messages per second at most (0: no limit)."),
) -> None:
    """Send dead letters again with a fresh retry count (bounded, audit-logged)."""
    settings = Settings()
    replayed = replay_dead_letters(
        settings, queue=queue, message_id=message_id, limit=limit, rate_per_s=rate
    )
    _audit(
        settings,
        "dramatiq.dead_letters_replayed",
        {"count": len(replayed), "message_ids": [r.message_id for r in replayed]},
    )
    typer.echo(f"replayed {len(replayed)} dead letter(s)")


@app.command()
def purge(
    queue: str = typer.Option(None, help="Only this queue."),
    yes: bool = typer.Option(False, "--yes", help="Do not ask."),
) -> None:
    """Delete dead letters for good (audit-logged)."""
    if not yes:
        typer.confirm("Delete the dead letters for good?", abort=True)
    settings = Settings()
    removed = purge_dead_letters(settings, queue=queue)
    _audit(settings, "dramatiq.dead_letters_purged", {"count": removed, "queue": queue or "*"})
    typer.echo(f"purged {removed} dead letter(s)")
