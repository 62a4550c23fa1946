"""Queue names, by workload: ops scale each with its own worker processes and threads.

They live in ``mailroom.queues``, which the processes that send by name import too.
"""

from mailroom.queues import (
    ALL,
    DELIVERY,
    INBOX,
    INTAKE,
    MAINTENANCE,
    MAPPING,
    OUTBOX,
    SYSTEM,
)

__all__ = ["ALL", "DELIVERY", "INBOX", "INTAKE", "MAINTENANCE", "MAPPING", "OUTBOX", "SYSTEM"]
