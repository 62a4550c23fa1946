"""A small harness as a benchmark runs one, for ``test_harness_cleanup``: stopped from outside.

``python -m tests.integration.small_harness BASE`` makes a throwaway state folder under
BASE, starts Postgres, Redis and NATS in it and one supervised child that has a child of
its own (as ``mailroom worker`` has Dramatiq's worker processes), prints ``ready FOLDER``
and waits; ``stopping`` when its cleanup begins, ``stopped`` when it ran to its end. Its cleanup is the benchmarks': ``finally``
blocks after ``stop_on_signals``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from mailroom.devtools.children import remove_folder, stop_on_signals, throwaway_folder
from mailroom.devtools.stack import EmbeddedNats, EmbeddedPostgres, EmbeddedRedis
from mailroom.devtools.supervisor import Child, Supervisor

#: The supervised child: starts a grandchild (which outlives it if left alone), says so, waits;
#: SIGTERM stops it after a second, as a worker finishes the messages it holds.
PARENT = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(0)))\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print('grandchild started', flush=True)\n"
    "time.sleep(600)\n"
)
#: How long the child may take to start its own, in seconds.
START_TIMEOUT_S = 30.0


def main(base: Path) -> None:
    stop_on_signals()
    state = throwaway_folder("harness-", base)
    supervisor = Supervisor(state)
    servers: list[EmbeddedPostgres | EmbeddedRedis | EmbeddedNats] = []
    try:
        for server in (
            EmbeddedPostgres(state / "postgres", fast=True),
            EmbeddedRedis(state / "redis"),
            EmbeddedNats(state / "nats"),
        ):
            servers.append(server)
            server.start()
        log = state / "parent.log"
        supervisor.add(Child("parent", [sys.executable, "-c", PARENT], {}, log))
        deadline = time.monotonic() + START_TIMEOUT_S
        while b"grandchild started" not in log.read_bytes():
            if time.monotonic() > deadline:
                raise SystemExit(f"the child did not start its own: {log.read_text()}")
            time.sleep(0.05)
        print(f"ready {state}", flush=True)
        while True:
            time.sleep(1)
    finally:
        print("stopping", flush=True)
        supervisor.stop()
        for server in reversed(servers):
            server.stop()
        remove_folder(state)
        print("stopped", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
