"""A worker's resources: the database pool keeps a connection for each of its threads."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import actors.middleware.resources
from actors.middleware.resources import ResourcesMiddleware, current, pooled
from mailroom.settings import DatabaseSettings, Settings


def test_the_pool_keeps_at_least_one_connection_per_actor_running_at_once():
    database = DatabaseSettings(pool_size=5)
    assert pooled(database, 8).pool_size == 8
    assert pooled(database, 3) is database, "a larger pool of the settings is kept"
    assert pooled(database, 0) is database, "outside a worker: the settings alone"


def test_a_booting_worker_sizes_its_resources_pool_by_its_threads(monkeypatch):
    for name in ("_settings", "_current", "_concurrency"):
        monkeypatch.setattr(
            actors.middleware.resources, name, getattr(actors.middleware.resources, name)
        )
    settings = Settings(database=DatabaseSettings(pool_size=5))
    actors.middleware.resources.configure(settings)

    ResourcesMiddleware(settings).before_worker_boot(None, SimpleNamespace(worker_threads=12))

    async def pool_size() -> int:
        engine = await current().engine()  # built without connecting
        try:
            return int(engine.sync_engine.pool.size())
        finally:
            await engine.dispose()

    assert asyncio.run(pool_size()) == 12
