"""Migrations apply to an empty database and match the models."""

from __future__ import annotations

import psycopg
import pytest

from mailroom.db.migrate import check, upgrade
from mailroom.db.models import Base

pytestmark = pytest.mark.integration


def test_upgrade_head_on_an_empty_database_matches_the_models(postgres_server, empty_database):
    url = postgres_server.url(empty_database)
    upgrade(url)
    check(url)  # raises on drift between models and migrations
    with psycopg.connect(postgres_server.dsn(empty_database)) as conn:
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


# Each foreign key and the indexes of its table that deleting a referred-to row can look its
# referrers up through: valid, the key's columns first, and no predicate but the key's NOT NULL.
_FOREIGN_KEYS = """
    SELECT c.conrelid::regclass::text AS tab, c.conname,
           array_agg(pg_get_indexdef(i.indexrelid) ORDER BY i.indexrelid)
               FILTER (WHERE i.indexrelid IS NOT NULL) AS indexes
      FROM pg_constraint AS c
      JOIN pg_attribute AS a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
      LEFT JOIN pg_index AS i
        ON i.indrelid = c.conrelid
       AND i.indisvalid
       AND (i.indkey::int2[])[0:cardinality(c.conkey) - 1] = c.conkey
       AND (i.indpred IS NULL
            OR pg_get_expr(i.indpred, i.indrelid) = format('(%I IS NOT NULL)', a.attname))
     WHERE c.contype = 'f' AND c.connamespace = 'public'::regnamespace
     GROUP BY 1, 2
     ORDER BY 1, 2
"""


def test_every_foreign_key_has_an_index_for_deletes_of_the_rows_it_refers_to(
    database_url, postgres_server
):
    name = database_url.rsplit("/", 1)[1]
    with psycopg.connect(postgres_server.dsn(name)) as conn:
        keys = conn.execute(_FOREIGN_KEYS).fetchall()
        # The referrers of a released object, as Postgres's own check on its delete asks.
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(
            row[0]
            for row in conn.execute(
                "EXPLAIN SELECT 1 FROM recognition_job WHERE result_object_id = 42"
            )
        )
    assert len(keys) >= 8  # every foreign key of the schema is looked at
    unindexed = [f"{table}.{key}" for table, key, indexes in keys if not indexes]
    assert unindexed == []
    assert "ix_recognition_job_result_object_id" in plan


def test_foreign_key_indexes_built_ahead_by_hand_or_left_invalid_still_migrate(
    postgres_server, empty_database
):
    """0015 builds its indexes concurrently: an operator may build them by hand first, and a
    concurrent build that failed leaves an invalid index of the same name behind."""
    name = empty_database
    url = postgres_server.url(name)
    upgrade(url, "0014")
    with psycopg.connect(postgres_server.dsn(name), autocommit=True) as conn:
        conn.execute(
            "CREATE INDEX CONCURRENTLY ix_stored_file_object_id ON stored_file (object_id)"
            " WHERE object_id IS NOT NULL"
        )
        (parent,) = conn.execute(
            "INSERT INTO stored_file (original_name, file_type) VALUES ('a.zip', 'zip') RETURNING id"
        ).fetchone()
        conn.execute(
            "INSERT INTO stored_file (original_name, file_type, parent_file_id)"
            " VALUES ('b.csv', 'csv', %(p)s), ('c.csv', 'csv', %(p)s)",
            {"p": parent},
        )
        with pytest.raises(psycopg.errors.UniqueViolation):  # two files of one parent
            conn.execute(
                "CREATE UNIQUE INDEX CONCURRENTLY ix_stored_file_parent_file_id"
                " ON stored_file (parent_file_id)"
            )
        left = conn.execute(_INDEX, {"name": "ix_stored_file_parent_file_id"}).fetchone()
    assert left == (False, True)  # invalid, unique: a failed build's leftover

    upgrade(url)
    check(url)
    with psycopg.connect(postgres_server.dsn(name)) as conn:
        keys = conn.execute(_FOREIGN_KEYS).fetchall()
        rebuilt = conn.execute(_INDEX, {"name": "ix_stored_file_parent_file_id"}).fetchone()
        kept = conn.execute(_INDEX, {"name": "ix_stored_file_object_id"}).fetchone()
    assert [f"{table}.{key}" for table, key, indexes in keys if not indexes] == []
    assert rebuilt == (True, False)
    assert kept == (True, False)


# Whether an index is valid (usable by queries), and whether it is unique.
_INDEX = "SELECT indisvalid, indisunique FROM pg_index WHERE indexrelid = to_regclass(%(name)s)"


def test_file_status_changes_update_in_place_on_pages_with_room(database_url, postgres_server):
    name = database_url.rsplit("/", 1)[1]
    with psycopg.connect(postgres_server.dsn(name)) as conn:
        (options,) = conn.execute(
            "SELECT reloptions FROM pg_class WHERE relname = 'stored_file'"
        ).fetchone()
        conn.execute(
            "INSERT INTO stored_file (original_name, file_type)"
            " SELECT 'invoice-' || n || '.csv', 'csv' FROM generate_series(1, 500) AS n"
        )
        conn.execute("UPDATE stored_file SET status = 'PROCESSING', updated_at = now()")
        # This transaction's counts: no other test's updates, no wait for the stats to flush.
        (hot,) = conn.execute(
            "SELECT n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'stored_file'"
        ).fetchone()
        conn.rollback()
    assert options == ["fillfactor=70"]
    # Full pages (the default fill factor) update a row or two in place: the last page's.
    assert hot >= 100
