"""Run work under a lease: a heartbeat renews it, and cancels the work once it is lost.

The work runs as its own task beside the heartbeat. When a renewal hits no row
(someone else holds the lease now) or fails (database down: we can no longer
prove the lease), the heartbeat cancels the work task only, and the caller gets
``LeaseLost``. A cancellation of the caller itself (worker shutdown) is never
turned into ``LeaseLost``: it propagates after the work task has finished its
cleanup.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from mailroom.errors import LeaseLost

logger = logging.getLogger(__name__)

T = TypeVar("T")

Renew = Callable[[], Awaitable[bool]]


async def run_under_lease(
    work: Coroutine[Any, Any, T], *, renew: Renew, interval_s: float, name: str = "lease"
) -> T:
    """Await ``work`` while ``renew`` runs every ``interval_s``; ``LeaseLost`` if renewal fails."""
    task = asyncio.create_task(work, name=f"{name}-work")
    lost: list[str] = []

    async def heartbeat() -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                # A renewal slower than the interval may already be too late: treat as lost.
                async with asyncio.timeout(interval_s):
                    renewed = await renew()
                reason = "" if renewed else "the lease is held by someone else"
            except Exception as exc:  # any failure means the lease can no longer be proven
                reason = f"renewal failed: {type(exc).__name__}: {str(exc)[:200]!r}"
            if reason:
                lost.append(reason)
                logger.warning("%s: %s; cancelling the work", name, reason)
                task.cancel()
                return

    beat = asyncio.create_task(heartbeat(), name=f"{name}-heartbeat")
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if lost and (current is None or current.cancelling() == 0):
            raise LeaseLost(f"{name}: {lost[0]}") from None
        raise
    finally:
        beat.cancel()
        # asyncio.wait never raises the heartbeat's own CancelledError into us.
        await asyncio.wait([beat])
