"""The delivery stream's own Redis (``delivery.redis_url``): used when set, checked like the others."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from mailroom.settings import Settings


def test_the_stream_uses_its_own_redis_when_set_else_the_main_one():
    assert Settings().stream_redis_url == Settings().redis.url
    settings = Settings(
        redis={"url": "redis://127.0.0.1:6379/0"},
        broker={"redis_url": "redis://127.0.0.1:6379/1"},
        delivery={"redis_url": "redis://127.0.0.1:6379/2"},
    )
    assert (settings.broker_redis_url, settings.stream_redis_url) == (
        "redis://127.0.0.1:6379/1",
        "redis://127.0.0.1:6379/2",
    )


def test_the_stream_redis_needs_rediss_when_tls_files_are_set(tmp_path: Path):
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    with pytest.raises(ValidationError, match=r"delivery\.redis_url is not a rediss:// URL"):
        Settings(
            redis={"url": "rediss://127.0.0.1:6380/0", "tls": {"ca_file": str(ca)}},
            delivery={"redis_url": "redis://127.0.0.1:6379/2"},
        )


def test_each_link_asks_the_sentinels_for_its_own_master():
    from mailroom.adapters.redis_client import async_client, sync_client

    settings = Settings(
        redis={"sentinels": ["127.0.0.1:26379"], "sentinel_master": "main"},
        broker={"sentinel_master": "jobs"},
        delivery={"sentinel_master": "outbound"},
    )
    broker = sync_client(settings.broker_redis_url, settings.broker_redis)
    stream = async_client(settings.stream_redis_url, settings.stream_redis)
    cache = sync_client(settings.redis.url, settings.redis)
    assert [c.connection_pool.service_name for c in (broker, stream, cache)] == [
        "jobs",
        "outbound",
        "main",
    ]
    plain = Settings(redis={"sentinels": ["127.0.0.1:26379"], "sentinel_master": "main"})
    assert plain.broker_redis.sentinel_master == plain.stream_redis.sentinel_master == "main"


def test_a_link_master_without_sentinels_is_refused():
    with pytest.raises(
        ValidationError, match=r"broker\.sentinel_master is set but redis\.sentinels"
    ):
        Settings(broker={"sentinel_master": "jobs"})
