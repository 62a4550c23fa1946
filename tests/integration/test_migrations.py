"""Migrations apply to an empty database and match the models."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from mailroom.migrate import check, upgrade
from mailroom.models import Base

pytestmark = pytest.mark.integration


def test_upgrade_head_on_an_empty_database_matches_the_models(postgres_server):
    with psycopg.connect(postgres_server.dsn("postgres"), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier("empty_mig"))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier("empty_mig")))
    url = postgres_server.url("empty_mig")
    upgrade(url)
    check(url)  # raises on drift between models and migrations
    with psycopg.connect(postgres_server.dsn("empty_mig")) as conn:
        tables = {
            row[0]
            for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        }
    assert set(Base.metadata.tables) <= tables
    assert "alembic_version" in tables


def test_each_test_gets_its_own_migrated_database(database_url, postgres_server):
    name = database_url.rsplit("/", 1)[1]
    with psycopg.connect(postgres_server.dsn(name)) as conn:
        count = conn.execute("SELECT count(*) FROM recognition_job").fetchone()
    assert count == (0,)
