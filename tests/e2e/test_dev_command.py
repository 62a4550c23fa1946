"""``mailroom dev`` comes up on embedded services, stops everything on Ctrl+C, and a restart
on the same state dir neither ingests nor notifies the sample mails again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest
from imapclient import IMAPClient

from mailroom.db.migrate import PROJECT_ROOT
from mailroom.devtools import docs_examples
from mailroom.devtools.children import spawn
from mailroom.devtools.dev import StageView
from mailroom.devtools.imap import DEMO_PASSWORD, DEMO_USER
from mailroom.devtools.seed import build_mail, invoice_csv, sample_mails
from mailroom.devtools.stack import free_port

pytestmark = pytest.mark.e2e


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _dev_env(ports: dict[str, int]) -> dict[str, str]:
    """The environment of a ``mailroom dev`` on ``ports``, and of a command beside it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    env.update(
        MAILROOM_DATABASE__URL=f"postgresql+psycopg://postgres@127.0.0.1:{ports['pg']}/mailroom",
        MAILROOM_REDIS__URL=f"redis://127.0.0.1:{ports['redis']}/0",
        MAILROOM_NATS__URL=f"nats://127.0.0.1:{ports['nats']}",
        # A command beside it (`mailroom dev` sets it for its own children).
        MAILROOM_NATS__ALLOW_ANONYMOUS="true",
    )
    if "console" in ports:
        env["MAILROOM_CONSOLE__PORT"] = str(ports["console"])
    return env


def _wait_for_console(port: int, run: DevRun) -> None:
    """The console child answers its health check once it has started."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
                if answer.read() == b"ok":
                    return
        except OSError:
            time.sleep(0.3)
    pytest.fail("the console never answered:\n" + run.output)


class DevRun:
    """One ``mailroom dev`` process and the lines it prints."""

    def __init__(self, state_dir: Path, ports: dict[str, int]) -> None:
        env = _dev_env(ports)
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.process = spawn(
            [
                sys.executable,
                "-m",
                "mailroom",
                "dev",
                "--state-dir",
                str(state_dir),
                "--imap-port",
                str(ports["imap"]),
                "--webhook-port",
                str(ports["webhook"]),
                "--smtp-port",
                str(ports["smtp"]),
            ],
            env=env,
            cwd=PROJECT_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode(errors="replace")
            self.lines.append(line)
            if "mailroom dev is ready" in line:
                self.ready.set()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def webhooks(self) -> int:
        return sum("received webhook" in line for line in self.lines)

    def wait_for_webhooks(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.webhooks() < count and time.monotonic() < deadline:
            time.sleep(0.2)
        assert self.webhooks() >= count, f"expected {count} webhooks:\n{self.output}"

    def stop(self) -> int:
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(60)
        self.reader.join(5)
        assert self.process.stdout is not None
        self.process.stdout.close()
        return code


def _wait_for_scheduler(dsn: str, run: DevRun) -> None:
    """The scheduler child takes leadership once it has started (slow on a busy machine)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'mailroom-scheduler%'"
            ).fetchone()
        if row and row[0]:
            return
        time.sleep(0.2)
    pytest.fail("scheduler never connected:\n" + run.output)


def _settled_stage_line(dsn: str) -> str:
    """The stage counts once every mail is final and every notification delivered."""
    deadline = time.monotonic() + 90
    line = ""
    while time.monotonic() < deadline:
        with psycopg.connect(dsn) as conn:
            line = StageView.line(conn)
            waiting = conn.execute(
                "SELECT (SELECT count(*) FROM inbound_mail WHERE status <> 'final')"
                " + (SELECT count(*) FROM channel_message WHERE status <> 'delivered')"
            ).fetchone()
        if waiting == (0,) and "notifications: -" not in line:
            return line
        time.sleep(0.5)
    pytest.fail(f"the samples never settled: {line}")


def _status_work_tables(ports: dict[str, int]) -> str:
    """``mailroom status``'s counts and what needs an operator, at 80 columns."""
    done = subprocess.run(
        [sys.executable, "-m", "mailroom", "status"],
        env={**_dev_env(ports), "COLUMNS": "80", "NO_COLOR": "1"},
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = done.stdout.splitlines()
    end = next(i for i, line in enumerate(lines) if line.strip() == "Oldest item per stage")
    return "\n".join(line.rstrip() for line in lines[:end]).strip("\n")


def _same_stage_line(in_docs: str, shown: str) -> bool:
    return in_docs.split(" ", 1)[1] == shown.split(" ", 1)[1]  # the time it was printed differs


def _same_status(in_docs: str, shown: str) -> bool:
    # The mailbox's cursor is idle or processing (waiting in IDLE) as the poll goes.
    def steady(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.strip().startswith("cursors")]

    return steady(in_docs) == steady(shown)


def _mail_count(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM inbound_mail").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.timeout(420)  # two runs of the whole stack (slow on a busy machine)
def test_dev_delivers_the_sample_mails_once_and_stops_cleanly_on_ctrl_c(tmp_path):
    ports = {
        "pg": free_port(),
        "redis": free_port(),
        "nats": free_port(),
        "imap": free_port(),
        "webhook": free_port(),
        "smtp": free_port(),
    }
    dsn = f"postgresql://postgres@127.0.0.1:{ports['pg']}/mailroom"
    state_dir = tmp_path / "state"
    samples = len(sample_mails())
    console_port = free_port()

    run = DevRun(state_dir, {**ports, "console": console_port})
    try:
        assert run.ready.wait(90), "dev did not come up:\n" + run.output
        for port in ports.values():
            assert _listening(port)
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT version_num FROM alembic_version").fetchone()
        _wait_for_scheduler(dsn, run)
        assert f"http://127.0.0.1:{console_port}" in run.output
        _wait_for_console(console_port, run)
        # What a new user sees: every sample mail ends as a notification at the webhook sink,
        # and the getting-started page shows where they end.
        run.wait_for_webhooks(samples, 90)
        settled = _settled_stage_line(dsn)
        docs_examples.check_example("dev-stages", "13:30:35 " + settled, same=_same_stage_line)
        docs_examples.check_example("dev-status", _status_work_tables(ports), same=_same_status)
    finally:
        code = run.stop()
    assert code == 0, run.output
    assert "everything stopped" in run.output
    for port in ports.values():
        assert not _listening(port), f"port {port} still open after dev stopped"

    # A restart keeps the mailbox: the samples are neither seeded nor notified again, and a
    # new mail still gets through (its UID continues above the old ones).
    run = DevRun(state_dir, {**ports, "console": console_port})
    try:
        assert run.ready.wait(90), "dev did not come back:\n" + run.output
        _wait_for_scheduler(dsn, run)
        late = build_mail(
            "After restart",
            [("invoice-9.csv", "text/csv", invoice_csv(9))],
            sender="late@example.test",
        )
        client = IMAPClient("127.0.0.1", port=ports["imap"], ssl=False, timeout=10)
        try:
            client.login(DEMO_USER, DEMO_PASSWORD)
            client.append("INBOX", late)
        finally:
            client.logout()
        run.wait_for_webhooks(1, 90)
        # Intake goes in UID order and the late mail has the highest UID: samples seeded
        # again would be in Postgres by now, and their notifications would follow at once.
        assert _mail_count(dsn) == samples + 1
        time.sleep(2)
        assert run.webhooks() == 1, run.output
    finally:
        code = run.stop()
    assert code == 0, run.output
