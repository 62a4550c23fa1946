"""Imported by the inbox bench's worker processes after ``actors``: timing and the no-op baseline.

``bench/outbox.py`` runs the inbox's worker as deployed, Dramatiq's CLI as ``mailroom worker``
runs it (``mailroom.process.dramatiq_main``: ``-Q inbox``, the processes and threads of ``mailroom
dev`` and the compose stack), with this module named after ``actors``. Each worker process
then appends a line per finished batch message to ``$BENCH_INBOX_TIMING_DIR/<pid>.txt``:
its enqueue time, when it finished (wall clock, seconds) and the results it carried. It also
writes ``<pid>.ready`` once its consumers run, so the bridge starts only then and neither
side of the ratio counts the workers' start. With ``BENCH_INBOX_NOOP=1`` the batch messages
are acked without running the actor: the baseline's no-op handler.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import dramatiq

TIMED = {"apply_recognition_messages", "apply_recognition_message"}


def carried(message: Any) -> int:
    """How many results one actor message carries (a batch, or one)."""
    if message.actor_name == "apply_recognition_messages":
        return len(message.args[0])
    return 1


class _Timing(dramatiq.Middleware):
    def __init__(self, folder: Path) -> None:
        self.path = folder / f"{os.getpid()}.txt"
        self.ready = folder / f"{os.getpid()}.ready"
        self.lock = threading.Lock()

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        self.ready.touch()

    def after_process_message(self, broker, message, *, result=None, exception=None):  # type: ignore[no-untyped-def]
        if message.actor_name not in TIMED:
            return
        line = f"{message.message_timestamp / 1000} {time.time()} {carried(message)} {int(exception is not None)}\n"
        with self.lock, self.path.open("a") as out:
            out.write(line)

    def after_skip_message(self, broker, message):  # type: ignore[no-untyped-def]
        self.after_process_message(broker, message)


class _Skipping(dramatiq.Middleware):
    def before_process_message(self, broker, message):  # type: ignore[no-untyped-def]
        if message.actor_name == "apply_recognition_messages":
            raise dramatiq.middleware.SkipMessage()


def _install() -> None:
    folder = os.environ.get("BENCH_INBOX_TIMING_DIR")
    if not folder:
        raise RuntimeError("bench/inbox_hooks.py runs only under bench/outbox.py")
    broker = dramatiq.get_broker()
    if os.environ.get("BENCH_INBOX_NOOP") == "1":
        broker.add_middleware(_Skipping())
    broker.add_middleware(_Timing(Path(folder)))


_install()
