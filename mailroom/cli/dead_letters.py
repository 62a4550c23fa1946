"""``mailroom dead-letters list|replay|purge``: Dramatiq's dead-letter queues on Redis.

Dramatiq keeps a failed message in ``{ns}:{queue}.XQ`` (ids by time) and
``{ns}:{queue}.XQ.msgs`` (id → message) for seven days; a message that failed
after a delay sits under the queue's ``.DQ`` name. Listing never prints message
arguments (they may carry mail text); replays are bounded and audit-logged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import redis
import typer
from dramatiq import Message
from rich.console import Console
from rich.table import Table

from mailroom.adapters.redis_client import CLI_REDIS_ATTEMPTS, sync_client
from mailroom.db.audit import OPERATOR, operator_id, record_audit_event
from mailroom.settings import Settings

#: Why the worker gave the message up (``actors.middleware.dead_letters`` stores it with the message).
REASON_OPTION = "dead_letter_reason"
#: Message options that describe the failed run, not the message.
DROPPED_OPTIONS = frozenset(
    {"retries", "traceback", "redis_message_id", "eta", "requeue_timestamp", REASON_OPTION}
)

app = typer.Typer(no_args_is_help=True, help="Inspect, replay or purge Dramatiq dead letters.")


@dataclass(frozen=True)
class DeadLetter:
    queue: str
    #: The id Redis files it under (each enqueue gets its own).
    redis_id: str
    message_id: str
    actor_name: str
    failed_at: datetime
    retries: int
    error: str


def _queues(settings: Settings) -> list[str]:
    from actors.queues import ALL

    return [name for queue in ALL for name in (queue, f"{queue}.DQ")]


def _client(settings: Settings) -> redis.Redis:
    return sync_client(
        settings.broker_redis_url, settings.broker_redis, attempts=CLI_REDIS_ATTEMPTS
    )


def _last_line(traceback: str | None) -> str:
    lines = [line for line in (traceback or "").strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def _error(options: dict[str, Any]) -> str:
    """The stored reason; messages dead-lettered before reasons were kept show their traceback."""
    reason = options.get(REASON_OPTION)
    return str(reason)[:200] if reason else _last_line(options.get("traceback"))


def _failed_ids(client: redis.Redis, key: str, limit: int) -> list[tuple[bytes, float]]:
    """The first ``limit`` Redis ids of a dead-letter queue, each with its time in ms."""
    # redis-py annotates zrange with every shape it can answer; with scores and no
    # decode_responses it is (bytes, float) pairs.
    return cast("list[tuple[bytes, float]]", client.zrange(key, 0, limit - 1, withscores=True))


def list_dead_letters(
    settings: Settings, *, queue: str | None = None, limit: int = 100
) -> list[DeadLetter]:
    ns = settings.broker.namespace
    client = _client(settings)
    found: list[DeadLetter] = []
    try:
        for name in [queue] if queue else _queues(settings):
            for raw_id, score in _failed_ids(client, f"{ns}:{name}.XQ", limit):
                redis_id = raw_id.decode()
                data = client.hget(f"{ns}:{name}.XQ.msgs", redis_id)
                if not isinstance(data, bytes):  # None: gone meanwhile (the client answers bytes)
                    continue
                message = Message.decode(data)
                found.append(
                    DeadLetter(
                        queue=name,
                        redis_id=redis_id,
                        message_id=message.message_id,
                        actor_name=message.actor_name,
                        failed_at=datetime.fromtimestamp(score / 1000, UTC),
                        retries=int(message.options.get("retries", 0)),
                        error=_error(message.options),
                    )
                )
    finally:
        client.close()
    return found[:limit]


def replay_dead_letters(
    settings: Settings, *, queue: str | None, message_id: str | None, limit: int, rate_per_s: float
) -> list[DeadLetter]:
    """Re-enqueue dead letters (fresh retry count) and remove them from the dead-letter queue."""
    from dramatiq.brokers.redis import RedisBroker

    ns = settings.broker.namespace
    # A plain broker on the same Redis: dead letters are a Redis matter, whatever broker is global.
    # Dramatiq leaves RedisBroker's constructor unannotated.
    broker = RedisBroker(client=_client(settings), namespace=ns)  # type: ignore[no-untyped-call]
    letters = list_dead_letters(
        settings, queue=queue, limit=limit if message_id is None else 10_000
    )
    if message_id is not None:
        letters = [letter for letter in letters if letter.message_id == message_id]
    client = _client(settings)
    replayed: list[DeadLetter] = []
    try:
        for letter in letters[:limit]:
            data = client.hget(f"{ns}:{letter.queue}.XQ.msgs", letter.redis_id)
            if not isinstance(data, bytes):  # None: gone meanwhile (the client answers bytes)
                continue
            message = Message.decode(data)
            # Fresh options: the retry count starts over and no stale eta or Redis id remains.
            fresh = dataclasses.replace(
                message,
                queue_name=message.queue_name.removesuffix(".DQ"),
                options={k: v for k, v in message.options.items() if k not in DROPPED_OPTIONS},
            )
            broker.enqueue(fresh)
            pipe = client.pipeline()
            pipe.zrem(f"{ns}:{letter.queue}.XQ", letter.redis_id)
            pipe.hdel(f"{ns}:{letter.queue}.XQ.msgs", letter.redis_id)
            pipe.execute()
            replayed.append(letter)
            if rate_per_s > 0:
                time.sleep(1 / rate_per_s)
    finally:
        client.close()
        broker.client.close()
    return replayed


def purge_dead_letters(settings: Settings, *, queue: str | None) -> int:
    ns = settings.broker.namespace
    client = _client(settings)
    removed = 0
    try:
        for name in [queue] if queue else _queues(settings):
            removed += int(client.zcard(f"{ns}:{name}.XQ"))
            client.delete(f"{ns}:{name}.XQ", f"{ns}:{name}.XQ.msgs")
    finally:
        client.close()
    return removed


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
