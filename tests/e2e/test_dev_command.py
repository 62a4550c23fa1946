"""``mailroom dev`` comes up on embedded services and stops everything on Ctrl+C."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psycopg
import pytest

from mailroom.devtools.seed import sample_mails
from mailroom.devtools.stack import free_port
from mailroom.migrate import PROJECT_ROOT

pytestmark = pytest.mark.e2e


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_dev_delivers_the_sample_mails_and_stops_cleanly_on_ctrl_c(tmp_path):
    ports = {
        "pg": free_port(),
        "redis": free_port(),
        "nats": free_port(),
        "imap": free_port(),
        "webhook": free_port(),
        "smtp": free_port(),
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    env.update(
        MAILROOM_DATABASE__URL=f"postgresql+psycopg://postgres@127.0.0.1:{ports['pg']}/mailroom",
        MAILROOM_REDIS__URL=f"redis://127.0.0.1:{ports['redis']}/0",
        MAILROOM_NATS__URL=f"nats://127.0.0.1:{ports['nats']}",
        MAILROOM_INTAKE__MAILBOXES=json.dumps([{"name": "dev", "port": ports["imap"]}]),
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mailroom",
            "dev",
            "--state-dir",
            str(tmp_path / "state"),
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
    lines: list[str] = []
    ready = threading.Event()
    delivered = threading.Event()

    def _read() -> None:
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.decode(errors="replace")
            lines.append(line)
            if "mailroom dev is ready" in line:
                ready.set()
            if sum("received webhook" in seen for seen in lines) == len(sample_mails()):
                delivered.set()

    reader = threading.Thread(target=_read, daemon=True)
    reader.start()
    try:
        assert ready.wait(90), "dev did not come up:\n" + "".join(lines)
        for port in ports.values():
            assert _listening(port)
        dsn = f"postgresql://postgres@127.0.0.1:{ports['pg']}/mailroom"
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT version_num FROM alembic_version").fetchone()
        # The scheduler child takes leadership once it has started.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with psycopg.connect(dsn) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'mailroom-scheduler%'"
                ).fetchone()
            if row and row[0]:
                break
            time.sleep(0.2)
        else:
            pytest.fail("scheduler never connected:\n" + "".join(lines))
        # What a new user sees: every sample mail ends as a notification at the webhook sink.
        assert delivered.wait(90), "sample mails were not delivered:\n" + "".join(lines)
    finally:
        process.send_signal(signal.SIGINT)
        code = process.wait(60)
        reader.join(5)
        assert process.stdout is not None
        process.stdout.close()
    output = "".join(lines)
    assert code == 0, output
    assert "everything stopped" in output
    for port in ports.values():
        assert not _listening(port), f"port {port} still open after dev stopped"
