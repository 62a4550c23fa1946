"""A worker whose Redis is down says so once per back-off step, not once per thread every 3 s."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from mailroom.db.migrate import PROJECT_ROOT
from mailroom.devtools.children import spawn
from mailroom.devtools.stack import free_port

pytestmark = [pytest.mark.faults, pytest.mark.timeout(300)]

#: How long we listen once the worker runs, in seconds: reports at about 0, 4 and 12 s.
LISTEN_S = 10.0


def test_a_worker_without_its_broker_reports_once_per_backoff_step(tmp_path):
    # Given a worker whose Redis URL points at a port nobody listens on
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    env.update(
        MAILROOM_BROKER__KIND="redis",
        MAILROOM_REDIS__URL=f"redis://:s3cret-pw@127.0.0.1:{port}/0",
        PYTHONPATH=str(PROJECT_ROOT),
    )
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        process = spawn(
            [sys.executable, "-m", "mailroom", "worker", "--processes", "1", "--threads", "2"],
            env=env,
            cwd=PROJECT_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while "ready for action" not in log.read_text(errors="replace"):
            assert process.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.1)

        # When it runs for a while
        time.sleep(LISTEN_S)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)

    # Then it said, a few times, which broker it cannot reach, without the password
    output = log.read_text(errors="replace")
    reports = re.findall(rf"Broker \S+@127\.0\.0\.1:{port}/0 is unreachable", output)
    assert 2 <= len(reports) <= 3, output
    assert "s3cret-pw" not in output
    # And no consumer thread repeated it
    assert "CRITICAL" not in output, output
    assert "Restarting consumer" not in output, output
    assert len(output.splitlines()) < 30, output
