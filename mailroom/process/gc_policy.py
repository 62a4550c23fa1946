"""The garbage collector's thresholds in Mailroom's long-running processes.

Reference counting frees almost every object a pass makes (rows, messages, requests);
the cyclic collector only finds what sits in a cycle. With CPython's default young
threshold (700 net allocations) it ran hundreds of times per process in a 1,000-mail
drain of ``bench/e2e.py`` and took 7-10 % of each process's start-up (importing makes
hundreds of thousands of objects, each pass walking the older ones again) and 2-3 % of
the workers' CPU after it: about 1.3 s of CPU in all. At 50,000 it ran a few times per
process, 0.6 s in all, most of it the worker's one collection before ``gc.freeze``.
Cycles still go within 50,000 allocations.
"""

from __future__ import annotations

import gc

#: Net allocations of tracked objects between young collections (CPython's default: 700).
YOUNG_THRESHOLD = 50_000
#: Young collections per middle one, and middle ones per full one (defaults: 10 and 10).
OLDER_THRESHOLDS = (20, 20)


def tune() -> None:
    """Rarer collections for this process; call it first in a long-running process."""
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)


def freeze_loaded() -> None:
    """Collect once, then keep the collector off everything loaded so far.

    A fork shares the parent's memory until it writes to it; the collector's passes write
    to every object they visit, so each forked worker would copy the shared modules page by
    page, and each pass would walk them again.
    """
    gc.collect()
    gc.freeze()
