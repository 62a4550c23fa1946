"""``mailroom migrate`` runs one at a time per database, under a Postgres advisory lock."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time

import psycopg
import pytest
from sqlalchemy import create_engine, pool

from mailroom.db import migrate
from mailroom.db.migrate import (
    DDL_LOCK_TIMEOUT_MS,
    MIGRATION_LOCK_KEY,
    PROJECT_ROOT,
    migration_lock,
)
from mailroom.errors import MigrationLockTimeout

pytestmark = pytest.mark.integration


class _Run:
    """A ``mailroom migrate`` process and the lines it printed so far (read as they come)."""

    def __init__(self, url: str) -> None:
        self.process = _migrate(url)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        self.lines.extend(self.process.stdout)

    def waits(self) -> bool:
        return any("Another migration run holds the lock" in line for line in self.lines)

    def finish(self, timeout: float) -> str:
        self.process.wait(timeout)
        self._reader.join(timeout)
        assert self.process.stdout is not None
        self.process.stdout.close()
        return "".join(self.lines)


def _migrate(url: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    # The buckets of the filesystem store go to a folder of the test's own.
    state_dir = tempfile.mkdtemp(prefix="mailroom-migrate-")
    env.update(
        MAILROOM_DATABASE__URL=url, MAILROOM_STATE_DIR=state_dir, PYTHONPATH=str(PROJECT_ROOT)
    )
    return subprocess.Popen(
        [sys.executable, "-m", "mailroom", "migrate"],
        env=env,
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


#: Longest a run may take to start and reach the lock on a loaded machine, in seconds.
START_TIMEOUT_S = 120


@pytest.mark.timeout(300)
def test_two_concurrent_migrate_runs_both_succeed_and_migrate_once(postgres_server, empty_database):
    dsn = postgres_server.dsn(empty_database)
    with psycopg.connect(dsn, autocommit=True) as holder:
        # Given another run holds the migration lock
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        # When two runs start at once
        runs = [_Run(postgres_server.url(empty_database)) for _ in range(2)]
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not all(run.waits() for run in runs) and time.monotonic() < deadline:
                assert all(run.process.poll() is None for run in runs), [r.lines for r in runs]
                time.sleep(0.1)
            # Then both wait for it, having changed nothing
            assert all(run.waits() for run in runs), [r.lines for r in runs]
            tables = holder.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
            assert tables.fetchone() == (0,)
        finally:
            holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
        outputs = [run.finish(timeout=START_TIMEOUT_S) for run in runs]

    # And once it is free both exit 0, one of them having run the migrations
    assert [run.process.returncode for run in runs] == [0, 0], outputs
    assert sum("Running upgrade" in output for output in outputs) == 1, outputs
    with psycopg.connect(dsn) as conn:
        versions = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    assert len(versions) == 1


def test_migrations_run_with_a_short_lock_timeout_under_the_lock(postgres_server, empty_database):
    engine = create_engine(postgres_server.url(empty_database), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection, migration_lock(connection):
            timeout = connection.exec_driver_sql("SHOW lock_timeout").scalar()
            held = connection.exec_driver_sql(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND pid = pg_backend_pid()"
            ).scalar()
            connection.rollback()
    finally:
        engine.dispose()
    assert timeout == f"{DDL_LOCK_TIMEOUT_MS // 1000}s"
    assert held == 1


def test_a_run_that_waits_too_long_for_the_lock_gives_up_and_says_why(
    postgres_server, empty_database, monkeypatch
):
    monkeypatch.setattr(migrate, "LOCK_WAIT_MS", 300)
    engine = create_engine(postgres_server.url(empty_database), poolclass=pool.NullPool)
    with psycopg.connect(postgres_server.dsn(empty_database), autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            with pytest.raises(MigrationLockTimeout, match="held the lock"):
                with engine.connect() as connection, migration_lock(connection):
                    pass
        finally:
            engine.dispose()
