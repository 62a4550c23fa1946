"""Dramatiq dead letters on real Redis: listed without arguments, replayed bounded, purged."""

from __future__ import annotations

import psycopg
import pytest
import redis
from dramatiq import Message
from dramatiq.brokers.redis import RedisBroker
from typer.testing import CliRunner

from mailroom.cli import app
from mailroom.db import libpq_dsn

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
