"""``python -m mailroom.dramatiq_main actors …``: Dramatiq's CLI, logging like every Mailroom process.

Dramatiq's main process never imports the actors, so it would log in Dramatiq's
own text format whatever ``MAILROOM_LOG__FORMAT`` says. Configured here first,
its root handler is also what the worker processes inherit when forked; it
writes to the current ``sys.stderr``, which Dramatiq points at the pipe it reads.

It also imports the libraries every worker process needs before Dramatiq forks them:
the processes share those pages instead of each importing them again.
"""

from __future__ import annotations

import gc
import importlib
import sys

from dramatiq.cli import main as dramatiq_main

from mailroom import gc_policy
from mailroom.observability import configure_logging
from mailroom.settings import Settings

#: What ``import actors`` spends most of its CPU on (about 1 s of each worker process's start),
#: imported once here and shared by the forked worker processes. Only modules that open no
#: connection, start no thread and register no metric when imported.
SHARED_IMPORTS = (
    "sqlalchemy.ext.asyncio",
    "sqlalchemy.dialects.postgresql.psycopg",
    "psycopg",
    "redis.asyncio",
    "nats",
    "dramatiq.brokers.redis",
    "mailroom.db",
    "mailroom.models",
)


def import_shared_modules() -> None:
    """Import ``SHARED_IMPORTS`` and keep the garbage collector off their pages in the forks."""
    for name in SHARED_IMPORTS:
        importlib.import_module(name)
    # A fork shares the parent's memory until it writes to it; the collector's passes write
    # to every object they visit, so each worker would copy the shared modules page by page.
    gc.collect()
    gc.freeze()


def main() -> int:
    gc_policy.tune()  # the worker processes it forks inherit the thresholds
    # Logging only: Sentry and the broker belong to the worker processes (``import actors``).
    configure_logging(Settings(), process="worker-main")
    import_shared_modules()
    return int(dramatiq_main() or 0)  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    sys.exit(main())
