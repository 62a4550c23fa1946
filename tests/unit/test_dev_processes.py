"""``mailroom dev`` runs every queue: intake on a worker of its own, the rest on the main one."""

from __future__ import annotations

from actors import queues
from mailroom.devtools.dev import WORKER_QUEUES, process_specs


def _queues(args: list[str]) -> set[str]:
    return {args[i + 1] for i, arg in enumerate(args) if arg == "-Q"}


def test_every_queue_has_one_worker_and_intake_its_own():
    specs = dict(process_specs())
    assert _queues(specs["worker-intake"]) == {queues.INTAKE}
    assert _queues(specs["worker"]) == set(WORKER_QUEUES)
    assert set(WORKER_QUEUES) | {queues.INTAKE} == set(queues.ALL)
    assert queues.INTAKE not in WORKER_QUEUES
