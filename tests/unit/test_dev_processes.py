"""``mailroom dev`` runs every queue: intake on a worker of its own, the rest on the main one."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from actors import queues
from mailroom.devtools.dev import PROCESS_NICE, WORKER_QUEUES, process_specs
from mailroom.devtools.supervisor import Child, Supervisor


def _queues(args: list[str]) -> set[str]:
    return {args[i + 1] for i, arg in enumerate(args) if arg == "-Q"}


def test_every_queue_has_one_worker_and_intake_its_own():
    specs = dict(process_specs())
    assert _queues(specs["worker-intake"]) == {queues.INTAKE}
    assert _queues(specs["worker"]) == set(WORKER_QUEUES)
    assert set(WORKER_QUEUES) | {queues.INTAKE} == set(queues.ALL)
    assert queues.INTAKE not in WORKER_QUEUES


def test_only_the_processes_after_intake_yield_the_cpu():
    specs = dict(process_specs())
    assert set(PROCESS_NICE) <= set(specs), "a priority for a process that does not exist"
    assert PROCESS_NICE.get("worker-intake", 0) == 0
    assert PROCESS_NICE.get("scheduler", 0) == 0
    # The compose stack's cpu_shares (tests/unit/test_docker_compose.py) is nice 10's weight.
    assert PROCESS_NICE == {
        name: 10 for name in ("worker", "bridge-nats", "bridge-stream", "recognizer")
    }


def _autogroup_nice(pid: int) -> int | None:
    path = Path(f"/proc/{pid}/autogroup")  # "/autogroup-123 nice 10", where the kernel has it
    return int(path.read_text().split()[-1]) if path.exists() else None


def test_a_child_runs_at_its_nice_value_in_a_group_of_its_own(tmp_path):
    supervisor = Supervisor(tmp_path)
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    ours = os.getpriority(os.PRIO_PROCESS, 0)  # what a child inherits (0 unless run under nice)
    nice = min(ours + 7, 19)
    supervisor.add(Child("yielding", sleep, dict(os.environ), tmp_path / "y.log", nice=nice))
    supervisor.add(Child("usual", sleep, dict(os.environ), tmp_path / "u.log"))
    try:
        yielding, usual = (child.process.pid for child in supervisor.children)
        assert os.getpriority(os.PRIO_PROCESS, yielding) == nice
        assert os.getpriority(os.PRIO_PROCESS, usual) == ours
        if _autogroup_nice(yielding) is not None:
            # Each child leads its own session: only its group's value weighs against others.
            assert _autogroup_nice(yielding) == nice
            assert _autogroup_nice(usual) == 0
    finally:
        supervisor.stop(timeout_s=5)
        for child in supervisor.children:
            child.close()
