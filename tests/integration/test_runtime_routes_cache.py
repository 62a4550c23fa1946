"""A worker's notification routes are re-read only when the route rows change."""

from __future__ import annotations

import psycopg
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import event

from mailroom.config_store import effective, rows
from mailroom.db.engine import transaction
from mailroom.settings import DeliverySettings, NotificationRoute

pytestmark = pytest.mark.integration

KEY = Fernet.generate_key().decode()


async def put_route(sessions, name, recipient, *, enabled=True):
    async with transaction(sessions) as session:
        await rows.put_row(
            session,
            kind="route",
            name=name,
            config={"channel": "log", "recipient": recipient},
            source="operator",
            actor="test",
            enabled=enabled,
        )


def recipients(delivery):
    return [route.recipient for route in delivery.routes]


async def test_routes_are_kept_until_a_route_row_changes(db_sessions, monkeypatch):
    cache = effective.runtime_routes()
    delivery = DeliverySettings(routes=[NotificationRoute(recipient="ops")])
    await put_route(db_sessions, "erp", "erp-team")
    reads = []
    read_routes = effective.routes

    async def counted(*args, **kwargs):
        reads.append(1)
        return await read_routes(*args, **kwargs)

    monkeypatch.setattr(effective, "routes", counted)

    first = await cache.get(db_sessions, delivery, KEY)
    again = await cache.get(db_sessions, delivery, KEY)
    assert recipients(first) == ["ops", "erp-team"]
    assert again is first and len(reads) == 1, "the rows were read and decrypted once"

    await put_route(db_sessions, "erp", "erp-team", enabled=False)
    assert recipients(await cache.get(db_sessions, delivery, KEY)) == ["ops"]
    await put_route(db_sessions, "finance", "finance-team")
    assert recipients(await cache.get(db_sessions, delivery, KEY)) == ["ops", "finance-team"]
    other = DeliverySettings(routes=[])
    assert recipients(await cache.get(db_sessions, other, KEY)) == ["finance-team"]
    assert len(reads) == 4


async def test_an_unchanged_check_is_one_statement_outside_any_transaction(
    db_sessions, monkeypatch
):
    cache = effective.runtime_routes()
    delivery = DeliverySettings(routes=[NotificationRoute(recipient="ops")])
    await cache.get(db_sessions, delivery, KEY)
    engine = db_sessions.kw["bind"].sync_engine
    through_sqlalchemy: list[str] = []
    seen: list[tuple[str, bool]] = []
    execute = psycopg.AsyncConnection.execute

    def statement(conn, cursor, sql, *args):
        through_sqlalchemy.append(sql)

    async def spied(self, query, *args, **kwargs):
        # In autocommit psycopg sends no BEGIN before it, nor a ROLLBACK at the end.
        seen.append((str(query).split()[0].upper(), self.autocommit))
        return await execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", spied)
    event.listen(engine, "before_cursor_execute", statement)
    try:
        await cache.get(db_sessions, delivery, KEY)
    finally:
        event.remove(engine, "before_cursor_execute", statement)
    assert seen == [("SELECT", True)]
    assert through_sqlalchemy == []
