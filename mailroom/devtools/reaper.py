"""The watchdog of ``children``: what a parent that died left running, killed; its folders, removed.

Run as a script (``python -I reaper.py``) with a pipe from its parent on standard input, one
line per change: ``group PGID`` / ``forget-group PGID`` for a child's process group,
``folder PATH`` / ``forget-folder PATH`` for a throwaway folder. When the pipe closes, the
parent has ended, however it ended (SIGKILL too): every group still told is killed with
SIGKILL (the child and whatever it started in its group: Dramatiq's worker processes,
Postgres's backends), and once they are gone every folder still told is removed. A parent
that stopped its children and removed its folders itself leaves nothing to do.

Standard library only: it starts in a few milliseconds and imports nothing of the project.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

#: How long the killed groups may take to be gone before the folders are removed, in seconds.
GONE_TIMEOUT_S = 10.0


def _members(groups: set[int]) -> set[int]:
    """The live processes (not zombies) of ``groups``, from ``/proc``."""
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended while we looked
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        state, _ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if state != "Z" and int(pgrp) in groups:
            found.add(int(entry.name))
    return found


def _kill(groups: set[int]) -> None:
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # gone already, or the number is someone else's now


def clean_up(groups: set[int], folders: list[str]) -> None:
    """Kill ``groups``, wait until they are gone, then remove ``folders``."""
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while groups and time.monotonic() < deadline:
        _kill(groups)
        if not _members(groups):
            break
        time.sleep(0.05)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    # In a session of its own no terminal signal reaches it; the parent's end is what it waits for.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    groups: set[int] = set()
    folders: dict[str, None] = {}
    for raw in sys.stdin.buffer:
        verb, _, argument = raw.decode("utf-8", "surrogateescape").rstrip("\n").partition(" ")
        if verb == "group":
            groups.add(int(argument))
        elif verb == "forget-group":
            groups.discard(int(argument))
        elif verb == "folder":
            folders[argument] = None
        elif verb == "forget-folder":
            folders.pop(argument, None)
    clean_up(groups, list(folders))


if __name__ == "__main__":
    main()
