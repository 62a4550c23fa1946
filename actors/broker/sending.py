"""Sending actor messages from async actors.

``actor.send`` talks to the broker (Redis) synchronously; called on a worker's
event loop it would stall every other actor on that loop for the round trip,
and a sweep sends up to its batch size. These helpers run the sends in a thread,
all sends of one call in one hop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import dramatiq


async def send_off_loop(actor: dramatiq.Actor[Any, Any], *args: Any) -> None:
    """``actor.send(*args)`` in a thread."""
    await asyncio.to_thread(actor.send, *args)


async def send_each_off_loop(
    actor: dramatiq.Actor[Any, Any], args: Iterable[tuple[Any, ...]]
) -> int:
    """``actor.send(*a)`` for each ``a`` of ``args``, in order, in one thread hop; the count sent."""
    sends = [partial(actor.send, *a) for a in args]
    if sends:
        await asyncio.to_thread(_run_all, sends)
    return len(sends)


def _run_all(sends: Sequence[Callable[[], object]]) -> None:
    for send in sends:
        send()
