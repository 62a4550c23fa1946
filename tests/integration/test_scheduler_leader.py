"""One scheduler leads at a time; a standby takes over when the leader's session ends."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from mailroom.db.engine import libpq_dsn
from mailroom.settings import DatabaseSettings, SchedulerSettings, Settings
from scheduling import metrics
from scheduling.leader import LeaderElection, current_leader
from scheduling.runner import SchedulerService

pytestmark = pytest.mark.integration

KEY = 424242


def test_only_one_election_wins_and_a_standby_takes_over_when_the_session_dies(database_url):
    dsn = libpq_dsn(database_url)
    leader = LeaderElection(dsn, KEY, name="leader-a")
    standby = LeaderElection(dsn, KEY, name="standby-b")
    try:
        assert leader.try_acquire()
        assert not standby.try_acquire()
        assert current_leader(dsn, KEY) == "leader-a"

        # The leader's backend dies (as when its process is killed -9).
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'leader-a'"
            )
        assert not leader.still_leader()
        assert standby.try_acquire()
        assert current_leader(dsn, KEY) == "standby-b"
    finally:
        leader.release()
        standby.release()


def test_the_leading_service_sends_its_jobs_and_stops_cleanly(database_url, stub_broker):
    settings = Settings(
        database=DatabaseSettings(url=database_url),
        scheduler=SchedulerSettings(leader_lock_key=KEY + 1, leader_retry_s=0.1),
    )
    service = SchedulerService(settings)
    thread = threading.Thread(target=service.run)
    thread.start()
    try:
        assert service.is_leader.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and stub_broker.queues["maintenance"].qsize() < 1:
            time.sleep(0.05)
        # Jobs run once at takeover: the sweeps are on their queue.
        assert stub_broker.queues["maintenance"].qsize() >= 1
        assert metrics.LEADER._value.get() == 1
        assert metrics.SENDS.labels("deadline_watchdog", "sent")._value.get() >= 1
    finally:
        service.stop()
        thread.join(10)
    assert not thread.is_alive()
    assert metrics.LEADER._value.get() == 0
    assert current_leader(libpq_dsn(database_url), KEY + 1) is None


def test_the_leader_connection_notices_a_dead_network_within_30_s(database_url):
    # A black-holed network closes no socket: keepalives on both ends must end the session.
    election = LeaderElection(libpq_dsn(database_url), KEY + 2, name="keepalive-a")
    try:
        assert election.try_acquire()
        conn = election._conn
        assert conn is not None
        client = conn.info.get_parameters()  # libpq's side of the socket
        assert client["keepalives"] == "1"
        idle, interval, count = (
            int(client[k]) for k in ("keepalives_idle", "keepalives_interval", "keepalives_count")
        )
        assert idle + interval * count <= 30
        assert int(client["tcp_user_timeout"]) <= 30_000
        # Postgres's side, which must end the session to free the lock for a standby.
        server = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in (
                "tcp_keepalives_idle",
                "tcp_keepalives_interval",
                "tcp_keepalives_count",
                "tcp_user_timeout",
            )
        }
        assert server == {
            "tcp_keepalives_idle": "10",
            "tcp_keepalives_interval": "5",
            "tcp_keepalives_count": "3",
            "tcp_user_timeout": "25000",
        }
    finally:
        election.release()
