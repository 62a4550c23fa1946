"""One Ctrl+C stops a process, even when the signal arrives twice.

Under ``uv run`` the terminal sends SIGINT to the whole process group and uv
forwards its own copy to the child, so every process sees a stop signal twice
within milliseconds. Taking the second as "kill now" (Dramatiq's worker) or
meeting it after the event loop removed its handlers (a ``KeyboardInterrupt``
traceback) turns one Ctrl+C into an unclean stop. ``StopHandler`` runs the
graceful stop on the first signal, ignores repeats within ``window_s`` and
exits at once on a later one, for an operator who really means "now".
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)

#: Stop signals this close to the first one are copies of it (terminal + uv), in seconds.
REPEAT_WINDOW_S = 2.0

Handler = Callable[[int, FrameType | None], Any]


class StopHandler:
    """A signal handler: ``graceful`` on the first signal, repeats dropped, a later one exits."""

    def __init__(
        self,
        graceful: Handler,
        *,
        kill_code: int = 1,
        window_s: float = REPEAT_WINDOW_S,
        kill: Callable[[int], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.graceful = graceful
        self.kill_code = kill_code
        self.window_s = window_s
        self.kill = kill or _exit_now
        self.clock = clock
        self.first_at: float | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        now = self.clock()
        if self.first_at is None:
            self.first_at = now
            logger.info("Stopping on %s", signal.Signals(signum).name)
            self.graceful(signum, frame)
        elif now - self.first_at >= self.window_s:
            logger.warning("Second %s: exiting without a clean stop", signal.Signals(signum).name)
            self.kill(self.kill_code)


def _exit_now(code: int) -> None:
    # os._exit: sys.exit would wait for non-daemon threads (Dramatiq's event loop, NATS).
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(code)


def handle_stop_signals(
    graceful: Handler,
    *,
    signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM),
    kill_code: int = 1,
) -> StopHandler:
    """Install one ``StopHandler`` for ``signums`` for the rest of the process' life.

    Call it from the main thread. An asyncio process passes
    ``lambda *_: loop.call_soon_threadsafe(stop.set)``: unlike ``loop.add_signal_handler``
    the handler outlives the loop, so a copy arriving during teardown is still dropped.
    """
    handler = StopHandler(graceful, kill_code=kill_code)
    for signum in signums:
        signal.signal(signum, handler)
    atexit.register(_ignore, signums)
    return handler


def _ignore(signums: tuple[int, ...]) -> None:
    # While Python finalizes it resets Python-level handlers to SIG_DFL, so a copy of the
    # stop signal arriving then would kill a process that already stopped cleanly (exit -2).
    # Ignored signals it leaves alone.
    for signum in signums:
        signal.signal(signum, signal.SIG_IGN)
