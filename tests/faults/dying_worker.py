"""Workers that die on marked input (``probe_actors``), restarted by the test as they die.

Dramatiq's main process stops when one of its worker processes dies, and the
supervisor would restart it only after a growing backoff; a test restarts it at
once instead, so each death costs a process start and nothing more.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from mailroom.devtools.supervisor import Child
from mailroom.devtools.system import System

#: ``python -m mailroom.process.dramatiq_main actors tests.faults.probe_actors``: the product's actors
#: and the probe's hooks in one worker process.
WORKER_ARGS = [
    sys.executable,
    "-m",
    "mailroom.process.dramatiq_main",
    "actors",
    "tests.faults.probe_actors",
    "--processes",
    "1",
    "--threads",
    "8",
]


@dataclass
class DyingWorkers:
    """``count`` such workers; ``check`` restarts the dead ones and counts the deaths.

    Two keep one ready while the other restarts (a start takes seconds on a loaded
    machine), so a death costs the lease or the broker's redelivery, not a start.
    """

    system: System
    count: int = 2
    deaths: int = 0
    children: list[Child] = field(default_factory=list, init=False)
    started: int = field(default=0, init=False)

    def start(self) -> DyingWorkers:
        for _ in range(self.count):
            self._start_one()
        return self

    def _start_one(self) -> None:
        self.started += 1
        label = f"worker-{self.started}"
        env = {**self.system.env, "PROBE_DIE": "1"}
        child = Child(label, WORKER_ARGS, env, self.system.logs / f"{label}.log")
        self.system.supervisor.add(child)
        self.children.append(child)

    def check(self) -> None:
        for child in list(self.children):
            assert child.process is not None
            if child.process.poll() is None:
                continue
            # Its main process is gone too: close its log, forget it, start another.
            child.close()
            self.system.supervisor.children.remove(child)
            self.children.remove(child)
            self.deaths += 1
            self._start_one()
