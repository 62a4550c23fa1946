"""Dramatiq's CLI, logging like every Mailroom process: ``mailroom worker`` runs it in its own
process (``python -m mailroom.process.dramatiq_main actors …`` does the same).

Dramatiq's main process never imports the actors, so it would log in Dramatiq's
own text format whatever ``MAILROOM_LOG__FORMAT`` says. Configured here first,
its root handler is also what the worker processes inherit when forked; it
writes to the current ``sys.stderr``, which Dramatiq points at the pipe it reads.

It also imports the libraries every worker process needs before Dramatiq forks them:
the processes share those pages instead of each importing them again.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

from dramatiq.cli import main as dramatiq_main
from dramatiq.cli import make_argument_parser

from mailroom import queues as actor_names
from mailroom.process import gc_policy, log_format
from mailroom.process.observability import configure_logging
from mailroom.settings import Settings

#: What ``import actors`` spends most of its CPU on (about 1 s of each worker process's start),
#: imported once here and shared by the forked worker processes. Only modules that open no
#: connection, start no thread and register no metric when imported.
SHARED_IMPORTS = (
    "sqlalchemy.ext.asyncio",
    "sqlalchemy.dialects.postgresql.psycopg",
    "psycopg",
    "redis.asyncio",
    # nats-py through the adapter: aiohttp is left for the webhook channel (websocket.py).
    "mailroom.adapters.nats",
    "dramatiq.brokers.redis",
    "mailroom.db.engine",
    "mailroom.db.models",
)


#: Imported too when the worker consumes the delivery queue: the webhook channel's client,
#: which each worker process would otherwise import on its first send (about 0.25 s of CPU).
DELIVERY_IMPORTS = ("aiohttp",)


def import_shared_modules(queues: Sequence[str] | None = None) -> None:
    """Import what worker processes on ``queues`` (default: all) need, and keep the garbage
    collector off those pages in the forks."""
    names = list(SHARED_IMPORTS)
    if queues is None or actor_names.DELIVERY in queues:
        names += DELIVERY_IMPORTS
    for name in names:
        importlib.import_module(name)
    gc_policy.freeze_loaded()


def reloadable_argv() -> None:
    """Make ``sys.argv`` a command Dramatiq can exec again when SIGHUP asks it to reload.

    Dramatiq reloads by exec'ing ``sys.argv[0]`` with ``sys.argv``. From the console script
    (``mailroom worker``, the image) that is the script itself; under ``python -m mailroom
    worker``, as ``mailroom dev`` starts it, it is ``mailroom/__main__.py``, which is not
    executable, so the reload failed and the worker was gone. The interpreter's own command
    line (``sys.orig_argv``: its options, ``-m`` and the module) starts the same process.
    """
    if not os.access(sys.argv[0], os.X_OK):
        sys.argv = [sys.executable, *sys.orig_argv[1:]]


def main(argv: list[str] | None = None, *, settings: Settings | None = None) -> int:
    """Dramatiq's CLI with ``argv`` (default: this process's arguments); its exit code."""
    gc_policy.tune()  # the worker processes it forks inherit the thresholds
    settings = settings or Settings()
    # Dramatiq reads its idle wait (consumers and worker threads) from the environment; set
    # here, ``python -m mailroom.process.dramatiq_main`` waits as ``mailroom worker`` does.
    os.environ.setdefault("dramatiq_worker_timeout", str(settings.broker.worker_poll_ms))
    # Logging only: Sentry and the broker belong to the worker processes (``import actors``).
    configure_logging(settings, process="worker-main")
    args = make_argument_parser().parse_args(argv)  # type: ignore[no-untyped-call]
    import_shared_modules(args.queues)
    # Dramatiq's main process writes its workers' output to its stderr unless it has a log
    # file: they then write theirs there themselves (log_format.CurrentStderrHandler).
    log_format.workers_write_stderr = args.log_file is None
    reloadable_argv()  # after the parse above, which reads sys.argv when argv is None
    return int(dramatiq_main(args) or 0)  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    sys.exit(main())
