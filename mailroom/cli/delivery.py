"""`mailroom delivery …`: operator commands for the delivery pipeline, and `notify`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from enum import StrEnum
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
            settings.stream_redis_url, settings.stream_redis, attempts=CLI_REDIS_ATTEMPTS
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
        # Redis first: a replay stored with Redis down would be reported as failed, and its
        # delivered marks could not be cleared. Down now, nothing is replayed.
        await client.ping()
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


class ResolvedAs(StrEnum):
    delivered = "delivered"
    failed = "failed"


@app.command()
def resolve(
    message_id: int = typer.Option(..., "--id", help="The uncertain message."),
    outcome: ResolvedAs = typer.Option(
        ..., "--as", help="delivered (the receiver got it) or failed (it did not)."
    ),
) -> None:
    """Settle an uncertain message once its receiver said whether it arrived (audit-logged).

    failed leaves it for delivery replay, which sends it again.
    """
    from mailroom.db.engine import create_engine, create_sessionmaker
    from mailroom.delivery.resolve import resolve_message
    from mailroom.errors import NotResolvable

    settings = _settings()

    async def work() -> None:
        engine = create_engine(settings.database)
        try:
            await resolve_message(
                create_sessionmaker(engine),
                message_id=message_id,
                outcome=outcome.value,
                actor_id=operator_id(),
            )
        finally:
            await engine.dispose()

    try:
        asyncio.run(work())
    except NotResolvable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"message {message_id} resolved as {outcome.value}")


#: Longest subject made from a notification's text, in characters (RFC 5322's line advice).
SUBJECT_CHARS = 78


def default_subject(text: str) -> str:
    """The text's first non-empty line, shortened: a notification never goes out untitled."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not line:
        return "Mailroom notification"
    return line if len(line) <= SUBJECT_CHARS else line[: SUBJECT_CHARS - 1] + "…"


#: Prefix of the dedupe key of a message stored by ``notify --idempotency-key``.
NOTIFY_KEY_PREFIX = "notify:"


def notify(
    text: str = typer.Argument(..., help="The message body."),
    channel: str = typer.Option(..., "--channel", help="log, webhook, email, …"),
    to: str = typer.Option(..., "--to", help="The recipient."),
    account: str = typer.Option(
        None,
        "--account",
        help="The channel's account: webhook and email need a configured one; others: default.",
    ),
    subject: str = typer.Option(
        None, "--subject", help="Default: the text's first line, shortened to 78 characters."
    ),
    idempotency_key: str = typer.Option(
        None,
        "--idempotency-key",
        help="Store once per key: the command repeated reports the message stored first.",
    ),
) -> None:
    """Store a notification and queue it for the workers; says which message it stored.

    With Redis down the message is still stored, and the scheduler's sweep queues it
    once Redis is back. Postgres down stores nothing.
    """
    if not subject:
        subject = default_subject(text)
    import redis.exceptions

    from mailroom.adapters.channels import plugin
    from mailroom.delivery.producer import create_message, enqueue_messages
    from mailroom.errors import ServiceUnavailable, UnknownChannel
    from mailroom.redaction import mask_urls

    try:
        plugin(channel)
    except UnknownChannel as exc:
        raise typer.BadParameter(str(exc), param_hint="--channel") from exc
    settings = _settings()
    dedupe_key = NOTIFY_KEY_PREFIX + idempotency_key if idempotency_key else None

    async def work(clients: Clients) -> str:
        sessions, client = clients
        async with transaction(sessions) as session:
            chosen = await _account_for(session, settings, channel, account)
            message_id = await create_message(
                session,
                channel=channel,
                account=chosen,
                recipient=to,
                subject=subject,
                body=text,
                dedupe_key=dedupe_key,
            )
            if message_id is None:
                earlier, state = await _message_with_key(session, dedupe_key)
                return (
                    f"message {earlier} was stored with idempotency key {idempotency_key!r} "
                    f"before (now {state}); nothing stored or sent again"
                )
        try:
            # The XADD is the only step left that can fail on Redis: the row is committed.
            await enqueue_messages(
                [message_id], redis=client, sessions=sessions, settings=settings.delivery
            )
        except (
            ServiceUnavailable,
            redis.exceptions.ConnectionError,
            redis.exceptions.TimeoutError,
        ) as exc:
            reason = mask_urls(str(exc).strip().splitlines()[0] if str(exc).strip() else "")
            return (
                f"stored as message {message_id}; it will be sent when Redis is reachable "
                f"(now: {reason or type(exc).__name__})"
            )
        return f"stored as message {message_id} and queued: {channel}/{chosen} to {to}"

    typer.echo(_run(settings, work))


async def _account_for(
    session: AsyncSession, settings: Settings, channel: str, account: str | None
) -> str:
    """The account to store: given and configured (webhook, e-mail), or ``default`` (others).

    Raises:
        typer.BadParameter: the channel needs an account and none, or an unknown one, was given.
    """
    from mailroom.config_store import effective, kinds
    from mailroom.config_store.secrets import Cipher

    if channel not in kinds.ACCOUNT_MODELS:
        return account or "default"
    cipher = Cipher(settings.runtime_config.key.get_secret_value())
    found = await effective.accounts(session, settings.delivery, cipher)
    configured = sorted(
        found.settings.webhook_accounts if channel == "webhook" else found.settings.email_accounts
    )
    known = f"configured: {', '.join(configured)}" if configured else "none is configured"
    if account is None:
        raise typer.BadParameter(f"{channel} needs an account ({known})", param_hint="--account")
    unusable = found.unusable.get(f"{channel}:{account}")
    if unusable is not None:
        raise typer.BadParameter(unusable, param_hint="--account")
    if account not in configured:
        raise typer.BadParameter(
            f"no {channel} account {account!r} ({known})", param_hint="--account"
        )
    return account


async def _message_with_key(session: AsyncSession, dedupe_key: str | None) -> tuple[int, str]:
    """The id and status of the message stored with ``dedupe_key``."""
    from sqlalchemy import select

    from mailroom.db.models import ChannelMessage

    row = (
        await session.execute(
            select(ChannelMessage.id, ChannelMessage.status).where(
                ChannelMessage.dedupe_key == dedupe_key
            )
        )
    ).one()
    return row.id, row.status
