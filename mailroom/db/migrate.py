"""Run alembic from code (CLI, dev stack, tests), one run at a time per database.

``alembic.ini`` and ``migrations/`` live at the top of a checkout; a wheel carries
them inside the package (``mailroom/_alembic/``, pyproject's ``force-include``), so
``mailroom migrate`` works from an installed package too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg.errors
from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, text
from sqlalchemy.exc import OperationalError

from mailroom.errors import MigrationLockTimeout

logger = logging.getLogger(__name__)

#: The repository root, where alembic.ini and migrations/ live in a checkout.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
#: Where an installed wheel keeps alembic.ini and migrations/.
PACKAGED_DIR = Path(__file__).resolve().parents[1] / "_alembic"

#: Postgres advisory lock every migration run holds (any fixed bigint; "mailroom" in ASCII).
MIGRATION_LOCK_KEY = 0x6D61696C726F6F6D
#: Longest a run waits for another run to finish, in milliseconds.
LOCK_WAIT_MS = 600_000
#: How often a waiting run tries the lock again, in seconds.
LOCK_POLL_S = 0.2
#: Longest one migration statement waits for a table lock, in milliseconds.
DDL_LOCK_TIMEOUT_MS = 10_000


def alembic_home() -> Path:
    """The folder holding ``alembic.ini`` and ``migrations/``: the wheel's, else the checkout's."""
    for home in (PACKAGED_DIR, PROJECT_ROOT):
        if (home / "alembic.ini").is_file() and (home / "migrations" / "env.py").is_file():
            return home
    raise FileNotFoundError(f"no alembic.ini and migrations/ in {PACKAGED_DIR} or {PROJECT_ROOT}")


def alembic_config(url: str) -> Config:
    home = alembic_home()
    config = Config(str(home / "alembic.ini"))
    config.set_main_option("script_location", str(home / "migrations"))
    config.attributes["url"] = url
    config.attributes["configure_logger"] = False
    return config


@contextmanager
def migration_lock(connection: Connection) -> Iterator[None]:
    """Hold the migration lock on ``connection``; its statements wait for table locks briefly.

    A second run waits here up to ``LOCK_WAIT_MS`` and then finds the schema at head.
    ``DDL_LOCK_TIMEOUT_MS`` makes a migration that queues behind a busy table fail
    instead of stalling every query queued behind it.

    The wait polls, each try its own short transaction, rather than blocking in
    ``pg_advisory_lock``: a statement waiting there keeps a snapshot open, and an index
    the running migration builds ``CONCURRENTLY`` waits for every older snapshot to end,
    which made the two runs wait for each other (Postgres: "deadlock detected").
    """
    if not _try_lock(connection):
        logger.info(
            "Another migration run holds the lock; waiting up to %d s", LOCK_WAIT_MS // 1000
        )
        deadline = time.monotonic() + LOCK_WAIT_MS / 1000
        while not _try_lock(connection):
            if time.monotonic() >= deadline:
                raise MigrationLockTimeout(
                    f"another migration run held the lock for over {LOCK_WAIT_MS // 1000} s"
                )
            time.sleep(LOCK_POLL_S)
    connection.exec_driver_sql(f"SET lock_timeout = {DDL_LOCK_TIMEOUT_MS}")
    # Session-level lock and setting survive the commit; alembic must begin its own
    # transaction, or it joins this one and nothing it runs is committed.
    connection.commit()
    yield
    # After an error the lock goes with the connection, which env.py never pools.
    connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
    connection.commit()


def _try_lock(connection: Connection) -> bool:
    """Take the migration lock if it is free, in a transaction of its own (ended here)."""
    taken = connection.execute(
        text("SELECT pg_try_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
    ).scalar()
    connection.commit()
    return bool(taken)


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate to ``revision``; ``MigrationLockTimeout`` if a lock wait ran out (see there)."""
    try:
        command.upgrade(alembic_config(url), revision)
    except OperationalError as exc:
        if not isinstance(exc.orig, psycopg.errors.LockNotAvailable):
            raise
        raise MigrationLockTimeout(
            f"a migration waited over {DDL_LOCK_TIMEOUT_MS // 1000} s for a table lock"
            " (a long transaction holds it) and stopped; run it again once that one ends"
        ) from exc


def check(url: str) -> None:
    """Raise when the models and the migrations disagree."""
    command.check(alembic_config(url))
