"""Exponential backoff: the one formula behind every wait between retries.

The actors' retry policy, the deliverer, the intake cursor, the stream bridge
and the dev supervisor all wait ``min(base * 2**attempt, cap)``, some with a
random jitter on top; they differ only in units and numbers, so they share this.
"""

from __future__ import annotations

import random

#: Highest exponent used: past it every realistic ``base`` has long reached its ``cap``,
#: and ``2**attempt`` of a runaway count stays a small number (no float overflow).
MAX_EXPONENT = 62


def backoff(
    attempt: int,
    *,
    base: float,
    cap: float,
    jitter: float = 0.0,
    rng: random.Random | None = None,
) -> float:
    """The wait after ``attempt`` (0 for the first wait): ``min(base * 2**attempt, cap)``.

    Args:
        attempt: Failures before this one that were already waited for (0, 1, 2, …).
        base: The first wait, in the caller's unit.
        cap: The longest wait before jitter, in the same unit.
        jitter: Largest random extra as a fraction of the wait (0.5 adds up to half
            again); drawn uniformly from ``rng`` (the ``random`` module if None).
    """
    delay: float = min(base * 2 ** min(attempt, MAX_EXPONENT), cap)
    if jitter:
        delay += (rng or random).uniform(0, delay * jitter)
    return delay
