"""Every process command stops cleanly on one Ctrl+C, also when the signal comes twice.

Under ``uv run`` one Ctrl+C is two SIGINTs: the terminal signals the process
group and uv forwards its own copy. The signals go to the process group, as a
terminal sends them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mailroom.db.migrate import PROJECT_ROOT
from mailroom.devtools.children import spawn

pytestmark = [pytest.mark.faults, pytest.mark.timeout(300)]

#: Log text each command prints once it serves.
READY = {
    "worker": "Worker process is ready for action",
    "bridge nats": "NATS bridge ready",
    "bridge stream": "Stream bridge",
    "bridge imap": "IMAP watcher",
    "scheduler": "is the leader",
    "recognizer": "recognizer: listening",
}
#: Longest start-up we wait for (a loaded CI machine), in seconds.
START_TIMEOUT_S = 120.0


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return spawn(
            args,
            env=env,
            cwd=PROJECT_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _wait_for_text(process: subprocess.Popen[bytes], log: Path, text: str, count: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if log.read_text(errors="replace").count(text) >= count:
            return
        assert process.poll() is None, f"exited early:\n{log.read_text(errors='replace')}"
        time.sleep(0.1)
    raise AssertionError(f"never printed {text!r}:\n{log.read_text(errors='replace')}")


def _interrupt(process: subprocess.Popen[bytes], times: int, gap_s: float = 0.4) -> float:
    """Send SIGINT to the process group ``times`` times, ``gap_s`` apart; the first's time."""
    sent_at = time.monotonic()
    for index in range(times):
        if index:
            time.sleep(gap_s)
        os.killpg(process.pid, signal.SIGINT)
    return sent_at


def _wait_exit(process: subprocess.Popen[bytes], log: Path, timeout_s: float) -> int:
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"still running {timeout_s}s after the signal:\n{log.read_text(errors='replace')[-3000:]}"
        ) from None


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(10)


@pytest.fixture
def process_env(make_system) -> dict[str, str]:
    """The e2e environment: every process pointed at the test's servers."""
    return dict(make_system().env)


@pytest.mark.parametrize("group_signals", [1, 2], ids=["one-ctrl-c", "two-ctrl-c"])
def test_worker_under_uv_run_stops_cleanly_on_ctrl_c(process_env, tmp_path, group_signals):
    # Given ``uv run mailroom worker`` with two worker processes that are ready
    log = tmp_path / "worker.log"
    args = ["uv", "run", "--no-sync", "mailroom", "worker", "--processes", "2", "--threads", "2"]
    process = _start(args, process_env, log)
    try:
        _wait_for_text(process, log, READY["worker"], count=2)

        # When Ctrl+C reaches the process group (each one twice: terminal and uv)
        sent_at = _interrupt(process, group_signals)

        # Then the worker finishes cleanly within seconds
        code = _wait_exit(process, log, timeout_s=10)
        took = time.monotonic() - sent_at
        assert code == 0, log.read_text(errors="replace")[-3000:]
        assert "Killing worker process" not in log.read_text(errors="replace")
        print(f"worker stopped {took:.1f}s after Ctrl+C")
    finally:
        _kill_group(process)


@pytest.mark.parametrize(
    "command", ["bridge nats", "bridge stream", "bridge imap", "scheduler", "recognizer"]
)
def test_process_stops_cleanly_on_two_signals_within_a_second(process_env, tmp_path, command):
    # Given a process command that is serving
    log = tmp_path / "process.log"
    process = _start([sys.executable, "-m", "mailroom", *command.split()], process_env, log)
    try:
        _wait_for_text(process, log, READY[command], count=1)

        # When SIGINT arrives twice within a second
        sent_at = _interrupt(process, 2)

        # Then it exits 0 within a few seconds, without a traceback
        code = _wait_exit(process, log, timeout_s=8)
        took = time.monotonic() - sent_at
        output = log.read_text(errors="replace")
        assert code == 0, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
        assert took < 8
    finally:
        _kill_group(process)


def test_worker_started_as_a_module_reloads_on_sighup(process_env, tmp_path):
    # Given ``python -m mailroom worker``, as ``mailroom dev`` starts it, ready to work
    log = tmp_path / "worker.log"
    args = [sys.executable, "-m", "mailroom", "worker", "--processes", "1", "--threads", "1"]
    process = _start(args, process_env, log)
    try:
        _wait_for_text(process, log, READY["worker"], count=1)

        # When SIGHUP asks Dramatiq's main process to reload
        os.kill(process.pid, signal.SIGHUP)

        # Then the same command starts again in that process and its worker is ready again
        # (Dramatiq execs ``sys.argv``: ``mailroom/__main__.py`` itself is not executable)
        _wait_for_text(process, log, READY["worker"], count=2)
        assert process.poll() is None
        _interrupt(process, 1)
        code = _wait_exit(process, log, timeout_s=10)
        output = log.read_text(errors="replace")
        assert code == 0, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
    finally:
        _kill_group(process)
