"""``mailroom bridge imap`` as a process: a watched folder's new mail is stored without a
scheduler pass, and the intake processes stop on time with their connections open."""

from __future__ import annotations

import os
import signal
import time

import pytest

from mailroom.devtools.seed import invoice_mails

pytestmark = pytest.mark.e2e

#: The bound on a stop that the Operating guide gives, in seconds.
STOP_BOUND_S = 3.0


def _watching(system) -> bool:
    """The watcher has announced the folder once (its first watch polls it)."""
    return system.scalar("SELECT count(*) FROM mailbox_cursor") >= 1


def test_a_watched_folders_new_mail_is_stored_without_a_scheduler_pass(make_system):
    # Given intake with the scheduler's pass an hour apart and the watcher on the folder
    system = make_system(MAILROOM_SCHEDULER__POLL_INTERVAL_S="3600")
    for name in ("worker-intake", "bridge-imap", "scheduler"):
        system.start(name)
    system.wait_for("the watcher's first poll", lambda: _watching(system), timeout_s=120)

    # When mail arrives
    uids = system.append(*invoice_mails(1, 2))

    # Then it is stored long before the next pass
    took = system.wait_for(
        "the new mail stored",
        lambda: system.scalar("SELECT count(*) FROM inbound_mail") == len(uids),
        timeout_s=60,
    )
    print(f"stored {took:.1f} s after APPEND (the pass is an hour apart)")


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["term", "int"])
def test_intake_processes_stop_on_time_with_connections_open(make_system, stop_signal):
    # Given a watcher holding its IDLE connection and an intake worker that keeps a login
    system = make_system(MAILROOM_SCHEDULER__POLL_INTERVAL_S="3600")
    children = [system.start(name) for name in ("worker-intake", "bridge-imap")]
    system.wait_for("the watcher's first poll", lambda: _watching(system), timeout_s=120)
    system.append(*invoice_mails(1, 1))
    system.wait_for(
        "a mail stored",
        lambda: system.scalar("SELECT count(*) FROM inbound_mail") == 1,
        timeout_s=60,
    )

    # When each gets one stop signal
    for child in children:
        assert child.process is not None and child.process.poll() is None
        os.kill(child.process.pid, stop_signal)
    signalled = time.monotonic()

    # Then each has exited by 3 s, cleanly
    exited: dict[str, float] = {}
    while len(exited) < len(children) and time.monotonic() - signalled < STOP_BOUND_S:
        for child in children:
            assert child.process is not None
            if child.name not in exited and child.process.poll() is not None:
                exited[child.name] = time.monotonic() - signalled
        time.sleep(0.02)
    print(
        ", ".join(f"{name} exited {took:.2f} s after the signal" for name, took in exited.items())
    )
    for child in children:
        assert child.name in exited, f"{child.name} still running {STOP_BOUND_S} s after the signal"
        assert child.process is not None
        log = child.log_path.read_text(errors="replace")
        assert child.process.returncode == 0, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
