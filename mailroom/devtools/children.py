"""Child processes and throwaway folders that end with the process that made them.

``mailroom dev``, the benchmarks and the tests start servers and Mailroom's processes as
children. A plain child outlives a parent killed with SIGKILL, or one whose cleanup a
second SIGTERM cut short (``timeout … uv run`` delivers two at once: timeout signals its
process group, and uv forwards the signal it got), and is left to init with part of its
state folder. Three things prevent that:

- ``spawn`` starts each child as the leader of a session of its own, with Linux's
  parent-death signal set to SIGKILL. The kernel sends it when the *thread* that started
  the child ends, so children are started from the main thread or from one thread that
  lives as long as the process (``_Spawner``), never from a short-lived one.
- Each child's process group and each ``throwaway_folder`` are told to a watchdog
  (``reaper.py``), a small process in a session of its own that holds the other end of a
  pipe. When the pipe closes (this process ended, however) it kills the groups still told,
  and with them the grandchildren nobody set a parent-death signal for (Dramatiq's worker
  processes), then removes the folders still told.
- ``stop_on_signals`` turns the first SIGTERM or SIGINT into ``SystemExit`` and ignores the
  ones after it, so the ``finally`` blocks stop what was started and remove its folders.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import FrameType
from typing import IO, Any, TypeVar

logger = logging.getLogger(__name__)

#: ``prctl`` option: the signal a process gets when its parent ends (linux/prctl.h).
PR_SET_PDEATHSIG = 1

_T = TypeVar("_T")


def _load_prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up once here: the child calls it between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_prctl = _load_prctl()


def _die_with(parent_pid: int) -> Callable[[], None]:
    """The child's step before exec: SIGKILL when the parent ends, or now if it has ended."""

    def set_parent_death_signal() -> None:
        if _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent ended before the signal was set
            os.kill(os.getpid(), signal.SIGKILL)

    return set_parent_death_signal


class _Watchdog:
    """The pipe to this process's ``reaper.py``, started on first use (again after a fork)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._owner = 0

    def tell(self, verb: str, argument: object) -> None:
        with self._lock:
            try:
                pipe = self._pipe()
                pipe.write(f"{verb} {argument}\n".encode("utf-8", "surrogateescape"))
                pipe.flush()
            except OSError as exc:
                logger.warning(
                    "the child watchdog is gone (%s): %s %s not told", exc, verb, argument
                )

    def _pipe(self) -> IO[bytes]:
        process = self._process
        if process is None or self._owner != os.getpid() or process.poll() is not None:
            # Its own session: neither a terminal's Ctrl+C nor a signal to our process group
            # (``timeout``) reaches it. Standard error stays ours, for its tracebacks.
            process = subprocess.Popen(
                [sys.executable, "-I", str(Path(__file__).with_name("reaper.py"))],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._process, self._owner = process, os.getpid()
        assert process.stdin is not None
        return process.stdin


_watchdog = _Watchdog()


class _Spawner:
    """Runs the fork of a child on a thread that lives as long as the process.

    The parent-death signal follows the thread that forked: a child started from a
    short-lived thread (an executor's, ``asyncio.to_thread``) would be killed when that
    thread ends. Calls from the main thread fork there; the others on this one thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def run(self, call: Callable[[], _T]) -> _T:
        if threading.current_thread() is threading.main_thread():
            return call()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="spawner", daemon=True)
                self._thread.start()
        done: Future[_T] = Future()
        self._calls.put((call, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            call, done = self._calls.get()
            try:
                done.set_result(call())
            except BaseException as exc:
                done.set_exception(exc)


_spawner = _Spawner()


class ChildProcess(subprocess.Popen[bytes]):
    """A child started by ``spawn``: once it is reaped, the watchdog forgets its group.

    Forgotten then, not before: a group number whose leader was reaped may be taken by an
    unrelated process later, which the watchdog must not kill.
    """

    _forgotten = False

    def poll(self) -> int | None:
        code = super().poll()
        if code is not None:
            self._forget()
        return code

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        self._forget()
        return code

    def _forget(self) -> None:
        if not self._forgotten:
            self._forgotten = True
            _watchdog.tell("forget-group", self.pid)


def spawn(args: Sequence[str | os.PathLike[str]], **popen_kwargs: Any) -> ChildProcess:
    """``subprocess.Popen`` for a long-lived child that ends with this process.

    The child leads a process group of its own (``start_new_session``), gets SIGKILL when
    this process ends, and its group is killed by the watchdog if it is still running then.
    """
    parent = os.getpid()
    if "preexec_fn" in popen_kwargs:
        raise TypeError("spawn sets preexec_fn itself")
    process = _spawner.run(
        lambda: ChildProcess(
            list(args), start_new_session=True, preexec_fn=_die_with(parent), **popen_kwargs
        )
    )
    _watchdog.tell("group", process.pid)
    return process


def throwaway_folder(prefix: str, base: Path | None = None) -> Path:
    """A new folder (``tempfile.mkdtemp``), removed by the watchdog if this process ends first.

    The caller removes it when done (``remove_folder``); the watchdog is for the ends that
    skip the caller's cleanup.
    """
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=base)).resolve()
    _watchdog.tell("folder", folder)
    return folder


def remove_folder(folder: Path) -> None:
    """Remove a ``throwaway_folder`` now; the watchdog forgets it."""
    shutil.rmtree(folder, ignore_errors=True)
    _watchdog.tell("forget-folder", folder)


def stop_on_signals(*signals: signal.Signals) -> None:
    """Make the first of ``signals`` (default SIGTERM and SIGINT) raise ``SystemExit``.

    The ones after it are ignored, so the ``finally`` blocks the first one set off stop
    what was started instead of being cut short. Ignored by a handler, not ``SIG_IGN``,
    which the children started meanwhile would inherit.
    """
    chosen = signals or (signal.SIGTERM, signal.SIGINT)

    def stop(signum: int, frame: FrameType | None) -> None:
        for each in chosen:
            signal.signal(each, _already_stopping)
        raise SystemExit(128 + signum)

    for each in chosen:
        signal.signal(each, stop)


def _already_stopping(signum: int, frame: FrameType | None) -> None:
    with contextlib.suppress(OSError):
        sys.stderr.write(f"{signal.Signals(signum).name} again: already stopping\n")
