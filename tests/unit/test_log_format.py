"""``MAILROOM_LOG__FORMAT=json``: one scrubbed JSON object per line, in every kind of process."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dramatiq
import pytest

from actors.middleware.log_context import MessageContext
from mailroom.process.log_format import JsonLogFormatter, ProcessName

REPO = Path(__file__).resolve().parents[2]
SENTINEL = "Sentinel-Pa55word-3307"
KEYS = {"time", "level", "logger", "message", "process", "pid"}

LOG_PROBE = f"""
import logging
from mailroom.cli import load_settings

load_settings("scheduler")
log = logging.getLogger("mailroom.probe")
log.info("connecting to postgresql://app:{SENTINEL}@db.internal/mailroom")
try:
    raise ConnectionError("refused: postgresql://app:{SENTINEL}@db.internal/mailroom")
except ConnectionError:
    log.exception("database down")
log.warning("two\\nlines")
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAILROOM_", "dramatiq_"))}
    env.update(MAILROOM_BROKER__KIND="stub", MAILROOM_LOG__FORMAT="json", **extra)
    return env


def _objects(text: str) -> list[dict]:
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines
    return [json.loads(line) for line in lines]  # every line is one JSON object


def test_a_cli_process_logs_one_scrubbed_json_object_per_line():
    done = subprocess.run(
        [sys.executable, "-c", LOG_PROBE],
        cwd=REPO,
        env=_env(MAILROOM_DATABASE__URL=f"postgresql+psycopg://app:{SENTINEL}@db.internal/m"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    records = _objects(done.stderr)
    assert SENTINEL not in done.stderr
    assert [r["message"] for r in records][-3:] == [
        "connecting to postgresql://app:***@db.internal/mailroom",
        "database down",
        "two\nlines",
    ]
    for record in records:
        assert KEYS <= record.keys()
        assert record["process"] == "scheduler"
    assert "ConnectionError: refused" in records[-2]["exc_info"]
    assert records[-2]["level"] == "ERROR" and records[-2]["logger"] == "mailroom.probe"


@pytest.fixture
def json_lines():
    """A root handler formatting as a worker's does, into a buffer."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ProcessName("worker"))
    handler.addFilter(MessageContext())
    handler.setFormatter(JsonLogFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    yield lambda: _objects(stream.getvalue())
    root.removeHandler(handler)


def test_lines_written_inside_a_message_carry_its_actor_and_id(
    stub_broker, stub_worker, json_lines
):
    log = logging.getLogger("mailroom.probe")

    @dramatiq.actor(broker=stub_broker, queue_name="log_probe", actor_name="log_probe_sync")
    def sync_probe() -> None:
        log.warning("inside sync")

    @dramatiq.actor(broker=stub_broker, queue_name="log_probe", actor_name="log_probe_async")
    async def async_probe() -> None:
        await asyncio.sleep(0)
        log.warning("inside async")

    sent = {"inside sync": sync_probe.send(), "inside async": async_probe.send()}
    stub_broker.join("log_probe")
    stub_worker.join()
    log.warning("outside")

    by_message = {r["message"]: r for r in json_lines()}
    for text, message in sent.items():
        assert by_message[text]["actor"] == message.actor_name
        assert by_message[text]["message_id"] == message.message_id
    assert "actor" not in by_message["outside"]


def _run_worker(module: str, log: Path) -> str:
    """Start ``python -m <module> actors``, wait until its worker is ready, stop it; its output."""
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", module, "actors", "-p", "1", "-t", "1"],
            cwd=REPO,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 90
            while "ready for action" not in log.read_text() and time.monotonic() < deadline:
                assert worker.poll() is None, log.read_text()[-2000:]
                time.sleep(0.2)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)
    return log.read_text()


def test_dramatiq_main_and_worker_processes_log_json(tmp_path):
    """The Dramatiq CLI through ``mailroom.process.dramatiq_main``: its main process and its workers."""
    records = _objects(_run_worker("mailroom.process.dramatiq_main", tmp_path / "worker.log"))
    processes = {r["message"]: r["process"] for r in records}
    assert processes["Worker process is ready for action."] == "worker"
    assert processes[f"Dramatiq '{dramatiq.__version__}' is booting up."] == "worker-main"


def test_plain_dramatiq_worker_processes_log_json(tmp_path):
    """``dramatiq actors`` itself: the workers' own handler gets the format on ``import actors``."""
    output = _run_worker("dramatiq", tmp_path / "worker.log")
    # Dramatiq's main process never imports the actors: its few lines stay in its format.
    worker_lines = [line for line in output.splitlines() if "MainProcess" not in line]
    records = _objects("\n".join(worker_lines))
    ready = next(r for r in records if r["message"] == "Worker process is ready for action.")
    assert ready["process"] == "worker"


class _ParentPipe(io.StringIO):
    """What Dramatiq makes a worker process's ``sys.stderr``: the pipe its parent reads."""


def test_a_worker_process_writes_its_records_to_the_inherited_stderr_itself(monkeypatch):
    from mailroom.process import log_format

    read_end, write_end = os.pipe()
    parent = _ParentPipe()
    monkeypatch.setattr(log_format, "workers_write_stderr", True)
    monkeypatch.setattr(sys, "stderr", parent)
    handler = log_format.CurrentStderrHandler()
    handler.fd = write_end
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    record = logging.LogRecord("mailroom.x", logging.INFO, __file__, 1, "Delivered %s", (7,), None)
    long = logging.LogRecord("mailroom.x", logging.ERROR, __file__, 1, "x" * 5000, None, None)
    try:
        # A line goes to the inherited stderr in one write; the parent's pipe gets nothing
        handler.emit(record)
        assert os.read(read_end, 65536) == b"INFO Delivered 7\n"
        assert parent.getvalue() == ""
        # A record longer than one atomic pipe write goes through the parent, whole
        handler.emit(long)
        assert parent.getvalue() == "ERROR " + "x" * 5000 + "\n"
    finally:
        os.close(read_end)
        os.close(write_end)


def test_outside_a_worker_process_records_go_to_sys_stderr(monkeypatch):
    from mailroom.process import log_format

    monkeypatch.setattr(log_format, "workers_write_stderr", False)
    parent = _ParentPipe()
    monkeypatch.setattr(sys, "stderr", parent)
    handler = log_format.CurrentStderrHandler()
    handler.fd = -1  # never written: a write to it would fail
    handler.emit(logging.LogRecord("mailroom.x", logging.INFO, __file__, 1, "hello", None, None))
    assert parent.getvalue() == "hello\n"
