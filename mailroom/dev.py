"""``mailroom dev``: the whole system on embedded services, stopped by Ctrl+C or SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

from rich.console import Console
from rich.table import Table

from mailroom.devstack import EmbeddedNats, EmbeddedPostgres, EmbeddedRedis, ServerStartError
from mailroom.migrate import PROJECT_ROOT, upgrade
from mailroom.settings import Settings
from mailroom.supervisor import Child, Supervisor

logger = logging.getLogger(__name__)


def _port(url: str) -> int:
    port = urlsplit(url.replace("+psycopg", "")).port
    if port is None:
        raise ValueError(f"no port in {url!r}")
    return port


def _child_env(settings: Settings, state_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()}
    env.update(
        MAILROOM_STATE_DIR=str(state_dir),
        MAILROOM_DATABASE__URL=settings.database.url,
        MAILROOM_REDIS__URL=settings.redis.url,
        MAILROOM_NATS__URL=settings.nats.url,
        PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")])),
        PYTHONUNBUFFERED="1",
    )
    return env


def _processes(state_dir: Path) -> list[tuple[str, list[str]]]:
    python = sys.executable
    return [
        ("worker", [python, "-m", "dramatiq", "actors", "--processes", "1", "--threads", "8"]),
        ("bridge-nats", [python, "-m", "mailroom", "bridge", "nats"]),
        ("bridge-stream", [python, "-m", "mailroom", "bridge", "stream"]),
        ("scheduler", [python, "-m", "mailroom", "scheduler"]),
        ("recognizer", [python, "-m", "mailroom", "recognizer"]),
    ]


def run_dev(state_dir: str | None = None) -> int:
    """Start the embedded stack and every process; block until a stop signal; stop it all."""
    settings = Settings(state_dir=Path(state_dir)) if state_dir else Settings()
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(name)s: %(message)s"
    )
    console = Console()
    state = settings.state_dir.resolve()
    state.mkdir(parents=True, exist_ok=True)
    logs = state / "logs"
    logs.mkdir(exist_ok=True)

    stopping = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)

    servers: list[EmbeddedPostgres | EmbeddedRedis | EmbeddedNats] = []
    supervisor = Supervisor(PROJECT_ROOT)
    try:
        try:
            postgres = EmbeddedPostgres(
                state / "postgres",
                port=_port(settings.database.url),
                database=urlsplit(settings.database.url).path.lstrip("/"),
            )
            servers.append(postgres.start())
            servers.append(EmbeddedRedis(state / "redis", port=_port(settings.redis.url)).start())
            servers.append(EmbeddedNats(state / "nats", port=_port(settings.nats.url)).start())
        except ServerStartError as exc:
            console.print(f"[bold red]mailroom dev: {exc}[/]")
            return 1
        upgrade(settings.database.url)
        env = _child_env(settings, state)
        for name, args in _processes(state):
            supervisor.add(Child(name, args, env, logs / f"{name}.log"))
        _print_ready(console, settings, state, supervisor)
        while not stopping.wait(1.0):
            supervisor.check()
        console.print("stopping…")
        return 0
    finally:
        supervisor.stop()
        for server in reversed(servers):
            server.stop()
        console.print("mailroom dev: everything stopped")


def _print_ready(console: Console, settings: Settings, state: Path, supervisor: Supervisor) -> None:
    table = Table(title="mailroom dev", show_header=True)
    table.add_column("what")
    table.add_column("where")
    table.add_row("postgres", settings.database.url)
    table.add_row("redis", settings.redis.url)
    table.add_row("nats (JetStream)", settings.nats.url)
    table.add_row("object store", str(settings.storage_root.resolve()))
    for child in supervisor.children:
        pid = child.process.pid if child.process else "-"
        table.add_row(child.name, f"pid {pid}, log {child.log_path}")
    table.add_row("state", str(state))
    console.print(table)
    console.print("mailroom dev is ready. Ctrl+C stops everything.", markup=False)
