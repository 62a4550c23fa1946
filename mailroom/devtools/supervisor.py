"""Runs Mailroom's processes as children, restarts the ones that die, stops them all."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from mailroom.backoff import backoff
from mailroom.devtools.children import spawn

logger = logging.getLogger(__name__)

#: Longest wait between restarts of a child that keeps dying, in seconds.
MAX_RESTART_DELAY_S = 30.0


def lower_priority(pid: int, nice: int) -> None:
    """Give a child that leads a session of its own the CPU priority ``nice``.

    Where Linux groups processes by session for scheduling (autogroup, on by default in
    most distributions), the CPU is shared between the groups first, and a process's own
    nice value weighs only against the other processes of its session: each child here
    leads one (``start_new_session``), so its group gets the value
    (``/proc/PID/autogroup``). Where that grouping is off (inside a container's cgroup,
    or disabled), the process's own value is what weighs; it is set too, before the
    child starts threads or worker processes, which inherit it. Raising a nice value
    needs no privilege; a failure is logged and the child runs at the usual priority.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except ProcessLookupError:
        pass  # it exited already: ``Supervisor.check`` reports and restarts it
    except FileNotFoundError:
        pass  # no autogroup in this kernel: the process's own value is enough
    except OSError as exc:
        logger.warning("could not set the CPU priority of pid %s to nice %s: %s", pid, nice, exc)


@dataclass
class Child:
    name: str
    args: Sequence[str]
    env: dict[str, str]
    log_path: Path
    #: CPU priority: above 0, this process yields the CPU to the others when both want it.
    nice: int = 0
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self, cwd: Path) -> None:
        self._log = self._log or open(self.log_path, "ab")
        self.process = spawn(
            self.args,
            env=self.env,
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        if self.nice:
            lower_priority(self.process.pid, self.nice)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def terminate(self) -> None:
        """SIGTERM to the child itself; it stops its own children (dramatiq's workers do)."""
        if self.running:
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the child's whole process group."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class Supervisor:
    """Starts children, restarts crashed ones with backoff, stops them in reverse order."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.children: list[Child] = []

    def add(self, child: Child) -> None:
        self.children.append(child)
        child.start(self.cwd)
        logger.info(
            "started %s (pid %s%s), log %s",
            child.name,
            child.process and child.process.pid,
            f", nice {child.nice}" if child.nice else "",
            child.log_path,
        )

    def check(self) -> None:
        """Restart children that exited, waiting longer after each crash."""
        now = time.monotonic()
        for child in self.children:
            if child.running or child.process is None:
                if child.process is None and now >= child.next_start:
                    child.start(self.cwd)
                continue
            code = child.process.returncode
            child.restarts += 1
            delay = backoff(child.restarts, base=1.0, cap=MAX_RESTART_DELAY_S)
            logger.warning(
                "%s exited with code %s; restarting in %.0fs (see %s)",
                child.name,
                code,
                delay,
                child.log_path,
            )
            child.process = None
            child.next_start = now + delay

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM every child (newest first), then SIGKILL what is left after the timeout.

        What is left includes a child's own children that outlived it in its process group.
        """
        for child in reversed(self.children):
            child.terminate()
        deadline = time.monotonic() + timeout_s
        for child in reversed(self.children):
            if child.process is None:
                continue
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop in time; killing it", child.name)
                child.kill()
                child.process.wait(5)
        for child in self.children:
            child.kill()  # a child's children it left behind, still in its group
            child.close()
