"""Who this process is, for other processes to read: ``host-pid``.

The stream bridge's consumer name, the delivery lock owner, the scheduler's
leader lock holder and the actor of system audit events all name the process
the same way, so one log line, lock value or audit row leads to the other.
"""

from __future__ import annotations

import os
import socket


def host_pid() -> str:
    """``{hostname}-{pid}`` of this process (read at each call: a forked child differs)."""
    return f"{socket.gethostname()}-{os.getpid()}"
