"""`mailroom delivery …`: operator commands for the delivery pipeline, and `notify`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio as aioredis
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from mailroom.adapters.redis_client import CLI_REDIS_ATTEMPTS, async_client
from mailroom.db.audit import operator_id
from mailroom.db.engine import create_engine, create_sessionmaker, transaction
from mailroom.settings import Settings

app = typer.Typer(no_args_is_help=True, help="Operate the delivery pipeline.")

T = TypeVar("T")

Clients = tuple[async_sessionmaker[AsyncSession], aioredis.Redis]


def _settings() -> Settings:
    from mailroom.cli import load_settings

    return load_settings("cli")


def _run(settings: Settings, work: Callable[[Clients], Awaitable[T]]) -> T:
    """Run ``work`` with a session factory and a Redis client, closing both afterwards."""

    async def main() -> T:
        engine = create_engine(settings.database)
        client = async_client(
            settings.stream_redis_url, settings.redis, attempts=CLI_REDIS_ATTEMPTS
        )
        try:
            return await work((create_sessionmaker(engine), client))
        finally:
            await client.aclose()
            await engine.dispose()

    return asyncio.run(main())


@app.command()
def status(
    limit: int = typer.Option(20, "--limit", min=0, help="Most stuck or failed messages listed."),
) -> None:
    """Counts per status and channel, the stream, then the messages that need an operator.

    Each listed message shows its id, which replay --id takes.
    """
    from mailroom.delivery.status import message_counts, stream_state, stuck_messages

    settings = _settings()

    async def work(clients: Clients) -> None:
        sessions, client = clients
        async with sessions() as session:
            counts = await message_counts(session)
            stuck, total = await stuck_messages(session, settings.delivery, limit=limit)
        state = await stream_state(client, settings.delivery)
        console = Console()
        table = Table(title="Channel messages")
        table.add_column("status")
        table.add_column("channel")
        table.add_column("count", justify="right")
        for message_status, channel, count in counts:
            table.add_row(message_status, channel, str(count))
        console.print(table)
        stream = Table(title=f"Stream {settings.delivery.stream_key}")
        for column in ("length", "pending", "bridges", "group"):
            stream.add_column(column, justify="right")
        stream.add_row(
            str(state.length),
            str(state.pending),
            str(state.consumers),
            settings.delivery.consumer_group if state.group_exists else "(not created yet)",
        )
        console.print(stream)
        if not total:
            console.print("Messages waiting for an operator: none")
            return
        title = f"Messages waiting for an operator ({len(stuck)} of {total}, oldest first)"
        listed = Table(title=title)
        for column in ("id", "channel/account", "status", "tries", "reason"):
            listed.add_column(column, justify="right" if column in ("id", "tries") else "left")
        for item in stuck:
            listed.add_row(
                str(item.id),
                escape(f"{item.channel}/{item.account}"),
                item.status,
                str(item.attempts),
                escape(item.reason),
            )
        console.print(listed)
        console.print("Send again: mailroom delivery replay --id ID (or --status STATUS)")

    _run(settings, work)


@app.command()
def replay(
    message_id: int = typer.Option(None, "--id", help="Replay this one message."),
    status: str = typer.Option(
        None, "--status", help="Replay messages in this status: failed, uncertain, partial_failed."
    ),
    limit: int = typer.Option(100, "--limit", min=1, help="Most messages replayed by --status."),
) -> None:
    """Put failed / uncertain / partially failed messages back to pending (audit-logged)."""
    from mailroom.delivery.replay import replay_messages
    from mailroom.errors import NotReplayable

    if (message_id is None) == (status is None):
        raise typer.BadParameter("give exactly one of --id and --status")
    settings = _settings()

    async def work(clients: Clients) -> list[int]:
        sessions, client = clients
        return await replay_messages(
            sessions=sessions,
            redis=client,
            settings=settings.delivery,
            actor_id=operator_id(),
            message_id=message_id,
            status=status,
            limit=limit,
        )

    try:
        ids = _run(settings, work)
    except NotReplayable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"replayed {len(ids)} message(s)" + (f": {ids[:50]}" if ids else ""))


#: Longest subject made from a notification's text, in characters (RFC 5322's line advice).
SUBJECT_CHARS = 78


def default_subject(text: str) -> str:
    """The text's first non-empty line, shortened: a notification never goes out untitled."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not line:
        return "Mailroom notification"
    return line if len(line) <= SUBJECT_CHARS else line[: SUBJECT_CHARS - 1] + "…"


def notify(
    text: str = typer.Argument(..., help="The message body."),
    channel: str = typer.Option(..., "--channel", help="log, webhook, email, …"),
    to: str = typer.Option(..., "--to", help="The recipient."),
    account: str = typer.Option("default", "--account"),
    subject: str = typer.Option(
        None, "--subject", help="Default: the text's first line, shortened to 78 characters."
    ),
) -> None:
    """Send a notification through a channel (created pending, delivered by the workers)."""
    if not subject:
        subject = default_subject(text)
    from mailroom.adapters.channels import plugin
    from mailroom.delivery.producer import create_message, enqueue_messages
    from mailroom.errors import UnknownChannel

    try:
        plugin(channel)
    except UnknownChannel as exc:
        raise typer.BadParameter(str(exc), param_hint="--channel") from exc
    settings = _settings()

    async def work(clients: Clients) -> int:
        sessions, client = clients
        async with transaction(sessions) as session:
            message_id = await create_message(
                session,
                channel=channel,
                account=account,
                recipient=to,
                subject=subject,
                body=text,
            )
        assert message_id is not None  # no dedupe key, so always inserted
        await enqueue_messages(
            [message_id], redis=client, sessions=sessions, settings=settings.delivery
        )
        return message_id

    typer.echo(f"message {_run(settings, work)} queued")
