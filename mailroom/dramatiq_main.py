"""``python -m mailroom.dramatiq_main actors …``: Dramatiq's CLI, logging like every Mailroom process.

Dramatiq's main process never imports the actors, so it would log in Dramatiq's
own text format whatever ``MAILROOM_LOG__FORMAT`` says. Configured here first,
its root handler is also what the worker processes inherit when forked; it
writes to the current ``sys.stderr``, which Dramatiq points at the pipe it reads.
"""

from __future__ import annotations

import sys

from dramatiq.cli import main as dramatiq_main

from mailroom.observability import configure_logging
from mailroom.settings import Settings


def main() -> int:
    # Logging only: Sentry and the broker belong to the worker processes (``import actors``).
    configure_logging(Settings(), process="worker-main")
    return int(dramatiq_main() or 0)  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    sys.exit(main())
