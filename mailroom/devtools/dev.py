"""``mailroom dev``: the whole system on embedded services, stopped by Ctrl+C or SIGTERM."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import psycopg
from rich.console import Console
from rich.table import Table

from mailroom.adapters.storage import create_buckets
from mailroom.db.dsn import psycopg_dsn
from mailroom.db.migrate import PROJECT_ROOT, upgrade
from mailroom.devtools.imap import ImapServer, demo_mailbox
from mailroom.devtools.seed import sample_mails
from mailroom.devtools.sinks import SmtpSink, WebhookSink
from mailroom.devtools.stack import EmbeddedNats, EmbeddedPostgres, EmbeddedRedis, ServerStartError
from mailroom.devtools.supervisor import Child, Supervisor
from mailroom.recognizer.pairing import ALLOW_REAL_MAILBOXES
from mailroom.settings import (
    DEV_IMAP_PORT,
    DEV_SMTP_PORT,
    DEV_WEBHOOK_PORT,
    Settings,
)
from mailroom.settings.base import ALLOW_ANONYMOUS_NATS, DEV_STATE_POSTGRES_DIR

logger = logging.getLogger(__name__)

#: Worker processes of ``mailroom dev`` (and of the e2e harness and benchmarks).
WORKER_PROCESSES = "2"
#: Threads of each of those processes (also the compose stack's inbox and delivery workers).
WORKER_THREADS = "8"
#: The queues of that worker: every queue but intake, which ``worker-intake`` runs.
WORKER_QUEUES = ("outbox", "inbox", "mapping", "delivery", "maintenance", "system")


#: CPU priority (nice) of the processes downstream of intake. On a machine whose cores
#: are all busy, reading the mailboxes goes first: every mailbox waits on intake (200
#: mailboxes of 10 mails on 2 cores: the last read after a median 10.2 s beside the rest
#: at equal priority, 6.4 s with these; ``bench/fairness.py``), while the stages after it
#: work from queues that keep their messages and catch up once intake is idle. The total
#: CPU is the same; a backlog's notifications come later, not slower. Intake, the
#: scheduler (it only sends polls) and the servers keep the usual priority. The compose
#: stack gives the same services the same weight (``cpu_shares``).
PROCESS_NICE = {"worker": 10, "bridge-nats": 10, "bridge-stream": 10, "recognizer": 10}


#: Settings of one process only, as compose gives them. The intake worker's threads and
#: consumers look for work every half second, not Dramatiq's every second: a stop waits for
#: each in turn, and intake processes stop within 3 s (the Operating guide).
PROCESS_ENV = {"worker-intake": {"MAILROOM_BROKER__WORKER_POLL_MS": "500"}}


def dev_child(
    spec: str, args: list[str], env: dict[str, str], log_path: Path, *, label: str | None = None
) -> Child:
    """The process ``spec`` of ``process_specs`` as a supervised child, at its CPU priority."""
    env = {**env, **PROCESS_ENV.get(spec, {})}
    return Child(label or spec, args, env, log_path, nice=PROCESS_NICE.get(spec, 0))


def dev_mailboxes(configured: str | None, *, imap_port: int = DEV_IMAP_PORT) -> str:
    """``MAILROOM_INTAKE__MAILBOXES`` for dev: served by the dev IMAP server, in plain text.

    The product has no default mailbox and no plain IMAP; dev supplies both. Configured
    mailboxes keep their own values and get the dev server's for the keys they leave
    out; broken JSON is passed on for the settings to report.
    """
    dev = demo_mailbox("dev", "127.0.0.1", imap_port)
    try:
        items = json.loads(configured) if configured else [{}]
    except json.JSONDecodeError:
        return configured or ""
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        return configured or ""
    return json.dumps([{**dev, **item} for item in items])


def _port(url: str) -> int:
    port = urlsplit(url.replace("+psycopg", "")).port
    if port is None:
        raise ValueError(f"no port in {url!r}")
    return port


def child_env(settings: Settings, state_dir: Path) -> dict[str, str]:
    """The environment of every child: this one, pointed at the embedded servers."""
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


def process_specs() -> list[tuple[str, list[str]]]:
    """Every Mailroom process, as (name, command line)."""
    python = sys.executable
    return [
        # ``mailroom worker`` runs Dramatiq's main for ``actors`` after preparing its environment.
        # The worker spends most of a mail's CPU (bench/e2e.py) and one process has one event
        # loop: two use both cores of a small machine.
        (
            "worker",
            [python, "-m", "mailroom", "worker", "-p", WORKER_PROCESSES, "-t", WORKER_THREADS]
            + [arg for queue in WORKER_QUEUES for arg in ("-Q", queue)],
        ),
        # Intake has a process of its own, as in the compose stack: polls then wait neither
        # for the worker's threads nor for its event loop while downstream work is queued.
        (
            "worker-intake",
            [python, "-m", "mailroom", "worker", "-Q", "intake", "--processes", "1", "-t", "8"],
        ),
        ("bridge-nats", [python, "-m", "mailroom", "bridge", "nats"]),
        ("bridge-stream", [python, "-m", "mailroom", "bridge", "stream"]),
        # The IMAP watcher: new mail becomes a poll at once, not at the next pass.
        ("bridge-imap", [python, "-m", "mailroom", "bridge", "imap"]),
        ("scheduler", [python, "-m", "mailroom", "scheduler"]),
        ("recognizer", [python, "-m", "mailroom", "recognizer"]),
    ]


#: The operators' console of ``mailroom dev``: sign-in with a name and a role, no password,
#: over plain HTTP on loopback. ``mailroom console`` refuses this sign-in anywhere else.
DEV_CONSOLE_ENV = {
    "MAILROOM_CONSOLE__AUTH": "dev",
    "MAILROOM_CONSOLE__DEV_SIGN_IN": "true",
    "MAILROOM_CONSOLE__SECURE_COOKIES": "false",
}


def console_spec() -> tuple[str, list[str]]:
    """The console's process: only ``mailroom dev`` starts it (the e2e harness needs none)."""
    return "console", [sys.executable, "-m", "mailroom", "console"]


def _dev_delivery_env(webhook: WebhookSink, smtp: SmtpSink) -> dict[str, str]:
    """Channels pointed at the local sinks, and routes that use all three channels."""
    routes = [
        {"channel": "log", "recipient": "ops"},
        {"channel": "webhook", "recipient": "finance", "subject": "Documents from {sender}"},
        {
            "channel": "email",
            "recipient": "ops@mailroom.test",
            "subject": "Mail {mail_subject!r} processed",
        },
    ]
    return {
        "MAILROOM_DELIVERY__WEBHOOK_ACCOUNTS": json.dumps({"default": webhook.account()}),
        # The sink is on loopback over http: allowed here by name, never by default.
        "MAILROOM_DELIVERY__WEBHOOK_ALLOWED_HOSTS": json.dumps(["127.0.0.1"]),
        "MAILROOM_DELIVERY__WEBHOOK_ALLOW_HTTP": "true",
        "MAILROOM_DELIVERY__EMAIL_ACCOUNTS": json.dumps(
            {"default": {"host": "127.0.0.1", "port": smtp.port, "security": "plain"}}
        ),
        "MAILROOM_DELIVERY__ROUTES": json.dumps(routes),
        "MAILROOM_SCHEDULER__POLL_INTERVAL_S": "5",
    }


def run_dev(
    state_dir: str | None = None,
    *,
    seed: bool = True,
    imap_port: int = DEV_IMAP_PORT,
    webhook_port: int = DEV_WEBHOOK_PORT,
    smtp_port: int = DEV_SMTP_PORT,
) -> int:
    """Start the embedded stack, sinks and every process; block until a stop signal; stop all."""
    # Set here, before Settings() reads it, so this process and every child see one value.
    name = "MAILROOM_INTAKE__MAILBOXES"
    os.environ[name] = dev_mailboxes(os.environ.get(name), imap_port=imap_port)
    # The reference recognizer may run beside a mailbox marked real only here (pairing.py).
    os.environ[ALLOW_REAL_MAILBOXES] = "true"
    # The embedded NATS server takes no login: the one place an open server is meant.
    os.environ[ALLOW_ANONYMOUS_NATS] = "true"
    settings = Settings(state_dir=Path(state_dir)) if state_dir else Settings()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    console = Console()
    state = settings.state_dir.resolve()
    logs = state / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    stopping = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)

    stoppers: list[Callable[[], None]] = []
    supervisor = Supervisor(PROJECT_ROOT)
    try:
        try:
            postgres = EmbeddedPostgres(
                state / DEV_STATE_POSTGRES_DIR,
                port=_port(settings.database.url),
                database=urlsplit(settings.database.url).path.lstrip("/"),
            ).start()
            stoppers.append(postgres.stop)
            stoppers.append(
                EmbeddedRedis(state / "redis", port=_port(settings.redis.url)).start().stop
            )
            stoppers.append(
                EmbeddedNats(state / "nats", port=_port(settings.nats.url)).start().stop
            )
        except ServerStartError as exc:
            console.print(f"[bold red]mailroom dev: {exc}[/]")
            return 1
        upgrade(settings.database.url)
        create_buckets(settings)
        announce = lambda line: console.print(f"[green]received[/] {line}")  # noqa: E731
        webhook = WebhookSink(port=webhook_port, on_receive=announce).start()
        stoppers.append(webhook.stop)
        smtp = SmtpSink(port=smtp_port, on_receive=announce).start()
        stoppers.append(smtp.stop)
        imap = _start_imap(settings, seed=seed)
        if imap is not None:
            stoppers.append(imap.stop)

        env = child_env(settings, state)
        for name, value in _dev_delivery_env(webhook, smtp).items():
            env.setdefault(name, value)
        for name, value in DEV_CONSOLE_ENV.items():
            env.setdefault(name, value)
        for name, args in [*process_specs(), console_spec()]:
            supervisor.add(dev_child(name, args, env, logs / f"{name}.log"))
        _print_ready(console, settings, state, supervisor, webhook, smtp, imap)
        view = StageView(psycopg_dsn(settings.database), console)
        while not stopping.wait(1.0):
            supervisor.check()
            view.refresh()
        console.print("stopping…")
        return 0
    finally:
        supervisor.stop()
        for stop in reversed(stoppers):
            try:
                stop()
            except Exception as exc:  # one failed stop must not leave the others running
                console.print(f"[red]stop failed: {exc}[/]")
        console.print("mailroom dev: everything stopped")


def _start_imap(settings: Settings, *, seed: bool) -> ImapServer | None:
    """The dev IMAP server for the first configured mailbox, seeded with sample mails.

    Its mail lives in the state dir beside Postgres's data, so a restart finds the
    same UIDs under the same UIDVALIDITY and intake reads nothing twice. The samples
    go in once per state dir: the marker file is written after they are appended.
    """
    mailboxes = [m for m in settings.intake.mailboxes if m.enabled]
    if not mailboxes:
        return None
    mailbox = mailboxes[0]
    data_dir = settings.state_dir.resolve() / "imap"
    server = ImapServer(port=mailbox.port, data_dir=data_dir).start()
    user, password = mailbox.username, mailbox.password.get_secret_value()
    try:
        server.add_user(user, password)
        if mailbox.folder.upper() != "INBOX":
            with server.client(user, password) as client:
                if not client.folder_exists(mailbox.folder):
                    client.create_folder(mailbox.folder)
        seeded = data_dir / "samples-seeded"
        if seed and not seeded.exists():
            server.append(mailbox.folder, *sample_mails(), user=user, password=password)
            seeded.touch()
    except BaseException:
        server.stop()
        raise
    return server


class StageView:
    """Counts per stage, printed whenever they change."""

    QUERIES = {
        "mails": "SELECT status, count(*) FROM inbound_mail GROUP BY status",
        "files": "SELECT status, count(*) FROM stored_file GROUP BY status",
        "jobs": "SELECT status, count(*) FROM recognition_job GROUP BY status",
        "documents": "SELECT status, count(*) FROM document GROUP BY status",
        "notifications": "SELECT channel || ':' || status, count(*) FROM channel_message GROUP BY 1",
    }

    def __init__(self, dsn: str, console: Console) -> None:
        self.dsn = dsn
        self.console = console
        self.last = ""

    @classmethod
    def line(cls, conn: psycopg.Connection[Any]) -> str:
        """The counts of every stage, as one line."""
        parts = []
        for stage, sql in cls.QUERIES.items():
            counts = ", ".join(f"{s} {n}" for s, n in sorted(conn.execute(sql).fetchall()))
            parts.append(f"{stage}: {counts or '-'}")
        return " | ".join(parts)

    def refresh(self) -> None:
        try:
            with psycopg.connect(self.dsn, connect_timeout=2) as conn:
                line = self.line(conn)
        except psycopg.Error as exc:
            line = f"database unavailable: {exc}"
        if line != self.last:
            self.last = line
            self.console.print(
                f"[dim]{datetime.now():%H:%M:%S}[/] {line}", markup=True, highlight=False
            )


def _print_ready(
    console: Console,
    settings: Settings,
    state: Path,
    supervisor: Supervisor,
    webhook: WebhookSink,
    smtp: SmtpSink,
    imap: ImapServer | None,
) -> None:
    table = Table(title="mailroom dev", show_header=True)
    table.add_column("what")
    table.add_column("where")
    table.add_row("postgres", settings.database.url)
    table.add_row("redis", settings.redis.url)
    table.add_row("nats (JetStream)", settings.nats.url)
    if imap is not None:
        mailbox = settings.intake.mailboxes[0]
        table.add_row(
            "imap (pymap)",
            f"127.0.0.1:{imap.port}, user {mailbox.username}, folder {mailbox.folder}",
        )
    table.add_row("webhook sink", webhook.url)
    table.add_row("smtp sink", f"127.0.0.1:{smtp.port}")
    table.add_row("object store", str((state / settings.storage.root).resolve()))
    where = settings.console
    table.add_row("console", f"http://{where.host}:{where.port} (sign in with any name and a role)")
    for child in supervisor.children:
        pid = child.process.pid if child.process else "-"
        table.add_row(child.name, f"pid {pid}, log {child.log_path}")
    console.print(table)
    console.print(
        "mailroom dev is ready. Sample mails are in the IMAP inbox; append more with any mail "
        "client. Ctrl+C stops everything.",
        markup=False,
    )
