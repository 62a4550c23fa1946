"""Dramatiq's dead-letter queues on Redis: list, replay and purge (``mailroom dead-letters``,
the console).

Dramatiq keeps a failed message in ``{ns}:{queue}.XQ`` (ids by time) and
``{ns}:{queue}.XQ.msgs`` (id → message) for seven days; a message that failed
after a delay sits under the queue's ``.DQ`` name. Listing never reads message
arguments out (they may carry mail text); replays are bounded.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import redis
from dramatiq import Message

from mailroom.adapters.redis_client import CLI_REDIS_ATTEMPTS, sync_client
from mailroom.queues import ALL
from mailroom.settings import Settings

#: Why the worker gave the message up (``actors.middleware.dead_letters`` stores it with the message).
REASON_OPTION = "dead_letter_reason"
#: Message options that describe the failed run, not the message.
DROPPED_OPTIONS = frozenset(
    {"retries", "traceback", "redis_message_id", "eta", "requeue_timestamp", REASON_OPTION}
)


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
