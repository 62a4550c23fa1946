"""Leader election through a Postgres advisory lock held on a dedicated connection.

The lock lives as long as the connection: when the leader dies (even kill -9)
the kernel closes its socket, Postgres ends the session and frees the lock, and
a standby polling ``try_acquire`` takes over within one retry period.

A black-holed network closes no socket: TCP keepalives and ``tcp_user_timeout``
on both ends end the session within about 25 s instead of the OS's minutes, so
Postgres frees the lock for a standby and the old leader learns it lost it.
"""

from __future__ import annotations

import logging

import psycopg

from mailroom.db.dsn import keepalive_args, server_keepalive_options
from mailroom.process.identity import host_pid
from mailroom.settings import DatabaseSettings

logger = logging.getLogger(__name__)


def holder_name() -> str:
    return f"mailroom-scheduler {host_pid()}"


class LeaderElection:
    """Holds (or waits for) the scheduler's advisory lock."""

    def __init__(
        self,
        dsn: str,
        key: int,
        *,
        name: str | None = None,
        database: DatabaseSettings | None = None,
    ) -> None:
        self.dsn = dsn
        self.database = database or DatabaseSettings()
        self.key = key
        self.name = name or holder_name()
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        #: The last failure logged: a standby retries every second, and says so only on a change.
        self._failure: str | None = None

    def _connect(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self.dsn,
                autocommit=True,
                application_name=self.name[:63],
                connect_timeout=self.database.connect_timeout_s,
                options=server_keepalive_options(self.database),
                **keepalive_args(self.database),
            )
        return self._conn

    def try_acquire(self) -> bool:
        """Take the lock if it is free; False when another process leads or Postgres is down."""
        try:
            row = self._connect().execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
        except psycopg.Error as exc:
            # psycopg adds a hint line; the first line names host, port and cause.
            failure = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if failure != self._failure:
                logger.warning("Leader election: database unavailable (retrying): %s", failure)
                self._failure = failure
            self._drop()
            return False
        if self._failure is not None:
            logger.info("Leader election: database reachable again")
            self._failure = None
        return bool(row and row[0])

    def still_leader(self) -> bool:
        """Is our session (and so our lock) still alive?"""
        if self._conn is None or self._conn.closed:
            return False
        try:
            self._conn.execute("SELECT 1")
        except psycopg.Error as exc:
            logger.warning("Leader election: lost the database session: %s", exc)
            self._drop()
            return False
        return True

    def release(self) -> None:
        if self._conn is not None and not self._conn.closed:
            try:
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
            except psycopg.Error as exc:
                logger.warning("Leader election: unlock failed (the session end frees it): %s", exc)
        self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def current_leader(dsn: str, key: int) -> str | None:
    """The application name of the session holding the lock, if any."""
    # A bigint advisory key is stored as (classid = high 32 bits, objid = low 32 bits).
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        row = conn.execute(
            """
            SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE l.locktype = 'advisory' AND l.granted
              AND l.classid = ((%(key)s::bigint >> 32) & 4294967295)::oid
              AND l.objid = (%(key)s::bigint & 4294967295)::oid AND l.objsubid = 1
            """,
            {"key": key},
        ).fetchone()
    return str(row[0]) if row else None
