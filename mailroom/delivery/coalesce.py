"""Group commit: many concurrent callers, one round trip for all who are waiting.

The delivery of a batch runs one task per message. Claims and settlements that
arrive while a round trip is in flight wait for the next one and go together,
so a batch of messages costs a few statements instead of one per message, and
a lone message still goes out at once (no timer, no waiting for company).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")

#: Runs one round trip for the given items; returns a result for each of them.
Flush = Callable[[Sequence[K]], Awaitable[dict[K, R]]]


class Coalescer(Generic[K, R]):
    """``await submit(item)`` returns ``flush``'s result for that item.

    Items submitted while a flush runs are flushed together right after it. An
    error of a flush reaches every caller of that flush, and no one else. Use
    one coalescer per event loop (it belongs to one batch).
    """

    def __init__(self, flush: Flush[K, R]) -> None:
        self._flush = flush
        self._waiting: list[tuple[K, asyncio.Future[R]]] = []
        self._runner: asyncio.Task[None] | None = None
        #: Round trips made so far (tests, metrics).
        self.flushes = 0

    async def submit(self, item: K) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.ensure_future(self._run())
        # A cancelled caller cancels only its own future: the flush runs in its own task.
        return await future

    async def _run(self) -> None:
        # One turn of the loop first, so callers made ready together are flushed together.
        await asyncio.sleep(0)
        while self._waiting:
            waiting, self._waiting = self._waiting, []
            self.flushes += 1
            try:
                results = await self._flush([item for item, _ in waiting])
            except Exception as exc:
                for _, future in waiting:
                    _settle(future, exception=exc)
                continue
            except BaseException:
                # Cancelled with the loop (shutdown): the callers are cancelled as well.
                for _, future in [*waiting, *self._waiting]:
                    future.cancel()
                raise
            for item, future in waiting:
                if item in results:
                    _settle(future, result=results[item])
                else:
                    _settle(future, exception=KeyError(f"no result for {item!r}"))

    async def aclose(self) -> None:
        """Wait for a flush in flight (its callers may have gone away)."""
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await self._runner


def _settle(
    future: asyncio.Future[R], *, result: R | None = None, exception: Exception | None = None
) -> None:
    if future.done():
        return
    if exception is not None:
        future.set_exception(exception)
        # Retrieved here so an abandoned caller does not leave "exception never retrieved".
        future.exception()
    else:
        future.set_result(result)  # type: ignore[arg-type]
