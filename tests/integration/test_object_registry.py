"""The object registry reuses the row of an already registered (bucket, key)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from mailroom.adapters.storage import StoredRef
from mailroom.db.engine import create_engine, create_sessionmaker, transaction
from mailroom.db.models import StoredObject
from mailroom.objects import register_object
from mailroom.settings import DatabaseSettings

pytestmark = pytest.mark.integration


async def test_registering_the_same_object_twice_reuses_its_row(database_url):
    engine = create_engine(DatabaseSettings(url=database_url))
    sessions = create_sessionmaker(engine)
    ref = StoredRef("results", "r/ab/abc.json", 2, "ab" * 32, "application/json")
    try:
        async with transaction(sessions) as session:
            first = await register_object(session, ref, role="results", created_by="test")
        async with transaction(sessions) as session:
            second = await register_object(session, ref, role="results", created_by="other")
            count = await session.scalar(select(func.count()).select_from(StoredObject))
        assert first.id == second.id
        assert second.created_by == "test"
        assert count == 1
    finally:
        await engine.dispose()
