"""Two real ``mailroom scheduler`` processes: kill -9 the leader, the standby leads within 5 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from mailroom.db.engine import libpq_dsn
from mailroom.db.migrate import PROJECT_ROOT
from mailroom.devtools.children import spawn
from scheduling.leader import current_leader

pytestmark = pytest.mark.faults

KEY = 777001


def _scheduler(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return spawn(
        [sys.executable, "-m", "mailroom", "scheduler"],
        env=env,
        cwd=PROJECT_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _leader_pid(dsn: str) -> int | None:
    name = current_leader(dsn, KEY)
    return int(name.rsplit("-", 1)[1]) if name else None


def _wait_for_leader(dsn: str, timeout_s: float, *, not_pid: int | None = None) -> int | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = _leader_pid(dsn)
        if pid is not None and pid != not_pid:
            return pid
        time.sleep(0.05)
    return None


def test_standby_takes_over_within_five_seconds_of_the_leaders_kill(database_url, redis_url):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    env.update(
        MAILROOM_DATABASE__URL=database_url,
        MAILROOM_REDIS__URL=redis_url,
        MAILROOM_SCHEDULER__LEADER_LOCK_KEY=str(KEY),
        MAILROOM_SCHEDULER__LEADER_RETRY_S="0.5",
        PYTHONPATH=str(PROJECT_ROOT),
    )
    dsn = libpq_dsn(database_url)
    processes = [_scheduler(env), _scheduler(env)]
    try:
        first = _wait_for_leader(dsn, 30)
        assert first in {p.pid for p in processes}
        leader = next(p for p in processes if p.pid == first)
        standby = next(p for p in processes if p.pid != first)

        os.kill(leader.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        second = _wait_for_leader(dsn, 10, not_pid=first)
        took = time.monotonic() - killed_at

        assert second == standby.pid
        assert took < 5, f"standby took {took:.1f}s to lead"
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                assert process.wait(15) in (0, -signal.SIGKILL)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
