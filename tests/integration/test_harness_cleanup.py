"""What a harness starts ends with it: after SIGTERM twice at once (what ``timeout … uv run``
delivers) or SIGKILL, none of its descendants is left and its state folder is gone.

The harness (``small_harness.py``) runs Postgres, Redis, NATS and a supervised child with a
child of its own, as the benchmarks and ``mailroom dev`` do, through ``mailroom.devtools``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mailroom.db.migrate import PROJECT_ROOT

#: Longest wait for the harness to come up, and for what it started to be gone, in seconds.
READY_TIMEOUT_S = 60.0
GONE_TIMEOUT_S = 30.0


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of a process, from ``/proc``; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0], int(fields[19])


def _descendants(root: int) -> dict[int, int]:
    """Every process below ``root``, by pid, with its start time (which tells a reused pid)."""
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[0], []).append(int(entry.name))
            started[int(entry.name)] = stat[2]
    found: dict[int, int] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = started[pid]
        todo += children.get(pid, [])
    return found


def _left(tree: dict[int, int]) -> list[str]:
    """The processes of ``tree`` still running (zombies waiting for init count as gone)."""
    left = []
    for pid, started in tree.items():
        stat = _stat(pid)
        if stat is not None and stat[2] == started and stat[1] != "Z":
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            left.append(f"{pid} {command.decode(errors='replace')[:120]}")
    return left


def _wait_until_gone(tree: dict[int, int]) -> list[str]:
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while (left := _left(tree)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, dict[int, int]]]:
    """The running harness, its state folder and its process tree."""
    errors = tmp_path / "harness.err"
    # NOTE: not under pytest's basetemp: another pytest starting meanwhile makes its root
    # private again, and Postgres (run as another user when we are root) loses its folder.
    base = Path(tempfile.mkdtemp(prefix="mailroom-harness-test-"))
    with errors.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.small_harness", str(base)],
            cwd=PROJECT_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        if not line.startswith("ready "):
            process.wait(READY_TIMEOUT_S)
            pytest.fail(f"the harness did not start ({line.strip()}):\n{errors.read_text()}")
        folder = Path(line.split(" ", 1)[1].strip())
        tree = _descendants(process.pid)
        yield process, folder, tree
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(READY_TIMEOUT_S)
        if process.stdout is not None:
            process.stdout.close()
        shutil.rmtree(base, ignore_errors=True)


def _check_the_tree(tree: dict[int, int]) -> None:
    # Postgres (with its own processes), Redis, NATS, the child and its child.
    assert len(tree) >= 5, tree
    commands = b"".join(Path(f"/proc/{pid}/cmdline").read_bytes() for pid in tree)
    for name in (b"postgres", b"redis-server", b"nats-server", b"time.sleep(600)"):
        assert name in commands, name


def test_sigterm_twice_at_once_stops_everything_and_removes_the_state(harness):
    process, folder, tree = harness
    _check_the_tree(tree)
    assert folder.is_dir()

    # Two at once (the kernel may merge them), then two more while it cleans up (its child
    # takes a second to stop).
    os.kill(process.pid, signal.SIGTERM)
    os.kill(process.pid, signal.SIGTERM)
    assert process.stdout is not None
    assert process.stdout.readline() == b"stopping\n"
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
        os.kill(process.pid, signal.SIGTERM)

    # Its own exit, or the default action of a signal that came as the interpreter shut down
    # (which restores it), after the cleanup.
    assert process.wait(GONE_TIMEOUT_S) in (128 + signal.SIGTERM, -signal.SIGTERM)
    assert process.stdout.read() == b"stopped\n"  # the later signals did not cut it short
    assert _wait_until_gone(tree) == []
    assert not folder.exists()


def test_sigkill_leaves_nothing_running_and_no_state(harness):
    process, folder, tree = harness
    _check_the_tree(tree)

    process.kill()

    assert process.wait(GONE_TIMEOUT_S) == -signal.SIGKILL
    assert _wait_until_gone(tree) == []
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not folder.exists()
