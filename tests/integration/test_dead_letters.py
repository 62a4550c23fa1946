"""Dramatiq dead letters on real Redis: listed without arguments, replayed bounded, purged."""

from __future__ import annotations

import time

import dramatiq
import psycopg
import pytest
import redis
from dramatiq import Message
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage
from typer.testing import CliRunner

from actors.middleware.dead_letters import DeadLetters
from actors.middleware.retry_policy import RetryPolicies, RetryPolicy
from mailroom.cli import app
from mailroom.db.engine import libpq_dsn
from mailroom.errors import PermanentError, RetryableError

pytestmark = pytest.mark.integration

BODY = "secret mail text"


def _dead_letter(redis_url: str, queue: str, n: int) -> list[str]:
    """Enqueue, fetch and nack ``n`` messages: what a worker does when one fails for good."""
    broker = RedisBroker(url=redis_url)
    ids = []
    try:
        broker.declare_queue(queue)
        for i in range(n):
            message = Message(
                queue_name=queue,
                actor_name="deliver_channel_message",
                args=(BODY, i),
                kwargs={},
                options={"retries": 3, "traceback": "Traceback\nRuntimeError: boom"},
            )
            ids.append(broker.enqueue(message).options["redis_message_id"])
        fetched = broker.do_fetch(queue, n)
        assert len(fetched) == n
        for redis_id in ids:
            broker.do_nack(queue, redis_id)
    finally:
        broker.client.close()
    return ids


@pytest.fixture
def cli_env(monkeypatch, redis_url, database_url):
    monkeypatch.setenv("MAILROOM_REDIS__URL", redis_url)
    monkeypatch.setenv("MAILROOM_DATABASE__URL", database_url)
    monkeypatch.setenv("COLUMNS", "250")  # rich tables unwrapped


def test_list_replay_and_purge(cli_env, redis_url, database_url):
    _dead_letter(redis_url, "delivery", 3)
    runner = CliRunner()

    listed = runner.invoke(app, ["dead-letters", "list"])
    assert listed.exit_code == 0, listed.output
    assert "deliver_channel_message" in listed.output
    assert "RuntimeError: boom" in listed.output
    assert BODY not in listed.output

    replayed = runner.invoke(
        app, ["dead-letters", "replay", "--queue", "delivery", "--limit", "2", "--rate", "0"]
    )
    assert replayed.exit_code == 0, replayed.output
    assert "replayed 2" in replayed.output
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.zcard("dramatiq:delivery.XQ") == 1
        assert client.llen("dramatiq:delivery") == 2
        requeued = [Message.decode(data) for data in client.hvals("dramatiq:delivery.msgs")]
        assert len(requeued) == 2
        assert all("retries" not in m.options for m in requeued)
    finally:
        client.close()

    purged = runner.invoke(app, ["dead-letters", "purge", "--yes"])
    assert purged.exit_code == 0, purged.output
    assert "purged 1" in purged.output

    with psycopg.connect(libpq_dsn(database_url)) as conn:
        actions = [row[0] for row in conn.execute("SELECT action FROM audit_event ORDER BY id")]
    assert actions == ["dramatiq.dead_letters_replayed", "dramatiq.dead_letters_purged"]


def test_list_shows_why_a_real_worker_gave_each_message_up(cli_env, redis_url):
    """Permanent failures and exhausted retries: the reason the worker stored, scrubbed."""
    secret = "Sentinel-Pa55word-9120"
    broker = RedisBroker(
        url=redis_url,
        middleware=[DeadLetters(secrets=[secret]), RetryPolicies(), CurrentMessage()],
    )

    @dramatiq.actor(broker=broker, queue_name="delivery", actor_name="deliver_channel_message")
    def deliver(message_id: int) -> None:
        raise PermanentError(f"unknown route for message {message_id}; token {secret}")

    @dramatiq.actor(
        broker=broker,
        queue_name="delivery",
        actor_name="deliver_channel_messages",
        retry_policy=RetryPolicy(base_ms=1, cap_ms=5, jitter=0, max_attempts=2),
    )
    def deliver_many(message_ids: list[int]) -> None:
        raise RetryableError("webhook answered 503")

    worker = dramatiq.Worker(broker, worker_timeout=50)
    worker.start()
    try:
        deliver.send(1)
        deliver_many.send([2, 3])
        deadline = time.monotonic() + 30
        while broker.client.zcard("dramatiq:delivery.XQ") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        worker.stop()
        broker.close()

    listed = CliRunner().invoke(app, ["dead-letters", "list"])
    assert listed.exit_code == 0, listed.output
    rows = {line.split("│")[3].strip(): line for line in listed.output.splitlines() if "│" in line}
    assert "PermanentError: unknown route for" in rows["deliver_channel_message"]
    assert "RetryableError: webhook answered 503" in rows["deliver_channel_messages"]
    assert secret not in listed.output
