"""Where a benchmark keeps its state, and how durable it is: as production, unless ``--fast``.

By default Postgres runs with fsync and synchronous commit on and its data, the
object store and every other state live on disk (under ``.mailroom`` in the
checkout). ``--fast`` turns fsync off and moves the state to /dev/shm; each run
prints which, since the two give different figures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from mailroom.devtools.children import remove_folder, stop_on_signals, throwaway_folder

ROOT = Path(__file__).resolve().parents[1]
SHM = Path("/dev/shm")


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fast",
        action="store_true",
        help="fsync off, state in /dev/shm: faster, not durable (default: durable, on disk)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the run's state folder goes (default: .mailroom, or /dev/shm with --fast)",
    )


def state_dir(args: argparse.Namespace, prefix: str) -> Path:
    """A fresh folder for the run's state; the caller removes it (``children.remove_folder``).

    SIGTERM (``timeout``, a supervisor) and SIGINT become SystemExit once, and repeats are
    ignored, so the run's ``finally`` blocks stop the servers and processes it started
    instead of orphaning them. Should the run die anyway, the child watchdog kills what it
    started and removes the folder (``mailroom.devtools.children``).
    """
    stop_on_signals()
    fast_base = SHM if SHM.is_dir() else ROOT / ".mailroom"
    base = args.workdir or (fast_base if args.fast else ROOT / ".mailroom")
    base.mkdir(parents=True, exist_ok=True)
    folder = throwaway_folder(prefix, base)
    print(describe(args, folder), flush=True)
    return folder


def describe(args: argparse.Namespace, folder: Path) -> str:
    how = (
        "NOT durable (--fast): Postgres fsync and synchronous_commit off"
        if args.fast
        else "durable: Postgres fsync and synchronous_commit on"
    )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{how}, state in {folder}; {cores} cores, load {os.getloadavg()[0]:.1f}"


@contextlib.contextmanager
def temporary_state(args: argparse.Namespace, prefix: str) -> Iterator[Path]:
    """``state_dir``, removed at the end."""
    folder = state_dir(args, prefix)
    try:
        yield folder
    finally:
        remove_folder(folder)
