"""The whole system as real child processes on given servers (e2e tests, benchmarks).

``system_env`` points every process at the servers and gives one run its own
subject prefix, stream, broker namespace and leader-lock key; ``System`` starts,
kills and watches the processes.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from mailroom.db.migrate import PROJECT_ROOT
from mailroom.devtools.dev import dev_child, process_specs
from mailroom.devtools.imap import ImapServer, demo_mailbox
from mailroom.devtools.sinks import WebhookSink
from mailroom.devtools.supervisor import Child, Supervisor


class SystemTimeout(AssertionError):
    """The system did not reach a state in time; carries the processes' log tails."""


@dataclass
class System:
    env: dict[str, str]
    dsn: str
    folder: str
    imap: ImapServer
    webhook: WebhookSink
    logs: Path
    supervisor: Supervisor = field(default_factory=lambda: Supervisor(PROJECT_ROOT))

    def start(
        self,
        name: str,
        *,
        label: str | None = None,
        env: dict[str, str] | None = None,
        extra_args: list[str] | None = None,
    ) -> Child:
        """Start one process of ``process_specs`` (``label`` names a second copy).

        ``env`` adds to (or overrides) the system's environment for this process only;
        ``extra_args`` go after its command line (``--queues`` for a worker).
        """
        args = dict(process_specs())[name] + (extra_args or [])
        label = label or name
        child = dev_child(
            name, args, {**self.env, **(env or {})}, self.logs / f"{label}.log", label=label
        )
        self.supervisor.add(child)
        return child

    def start_all(self) -> None:
        for name, _ in process_specs():
            self.start(name)

    def child(self, label: str) -> Child:
        return next(c for c in self.supervisor.children if c.name == label)

    def kill(self, label: str) -> None:
        """kill -9 a process and its children, and forget it."""
        child = self.child(label)
        child.kill()
        assert child.process is not None
        child.process.wait(10)
        child.close()
        self.supervisor.children.remove(child)

    def append(self, *mails: bytes) -> list[int]:
        return self.imap.append(self.folder, *mails)

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()

    def scalar(self, sql: str, *params: Any) -> Any:
        return self.query(sql, *params)[0][0]

    def wait_for(self, what: str, check: Callable[[], bool], timeout_s: float) -> float:
        """Poll ``check`` until true; fail with the process logs' tails otherwise."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if check():
                return time.monotonic() - started
            time.sleep(0.25)
        tails = "\n".join(
            f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            for log in sorted(self.logs.glob("*.log"))
        )
        raise SystemTimeout(f"timed out after {timeout_s}s waiting for {what}\n{tails}")

    def stop(self) -> None:
        self.supervisor.stop()

    def kill_all(self) -> None:
        """kill -9 every process: a test's end, where a graceful stop only costs seconds."""
        for child in list(self.supervisor.children):
            self.kill(child.name)


def system_env(
    *,
    database_url: str,
    redis_url: str,
    nats_url: str,
    state_dir: Path,
    imap: ImapServer,
    folder: str,
    webhook: WebhookSink,
    idle: bool = True,
    **overrides: str,
) -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    mailbox = {
        **demo_mailbox("e2e", imap.host, imap.port),
        "folder": folder,
        "idle": idle,
        "batch_size": 25,
    }
    env.update(
        PYTHONPATH=str(PROJECT_ROOT),
        PYTHONUNBUFFERED="1",
        MAILROOM_LOG__LEVEL="INFO",
        MAILROOM_STATE_DIR=str(state_dir),
        MAILROOM_DATABASE__URL=database_url,
        MAILROOM_REDIS__URL=redis_url,
        MAILROOM_BROKER__NAMESPACE=f"e2e{tag}",
        MAILROOM_BROKER__HEARTBEAT_TIMEOUT_MS="3000",
        MAILROOM_BROKER__MAINTENANCE_INTERVAL_S="0.5",
        MAILROOM_NATS__URL=nats_url,
        MAILROOM_NATS__ALLOW_ANONYMOUS="true",  # the embedded server takes no login
        MAILROOM_NATS__SUBJECT_PREFIX=f"e2e{tag}.",
        MAILROOM_NATS__STREAM_NAME=f"E2E{tag}",
        MAILROOM_NATS__INBOX_DURABLE=f"inbox{tag}",
        MAILROOM_RECOGNITION__ACK_TIMEOUT_S="5",
        # A worker killed between the inbox's commit and its send to mapping leaves results
        # for the unmapped sweep: short here, so fault tests do not wait a minute for it.
        MAILROOM_RECOGNITION__UNMAPPED_AFTER_S="5",
        # The no-ack window (5 s x 4) must be twice the bridge's ack wait (a Settings check).
        MAILROOM_NATS__BRIDGE_ACK_WAIT_S="10",
        # The gate closes for silence within the no-ack window (a Settings check).
        MAILROOM_RECOGNITION__SILENCE_AFTER_S="10",
        MAILROOM_INTAKE__MAILBOXES=json.dumps([mailbox]),
        MAILROOM_INTAKE__LEASE_S="6",
        MAILROOM_DELIVERY__STREAM_KEY=f"e2e{tag}:delivery-stream",
        MAILROOM_DELIVERY__CLAIM_IDLE_MS="3000",
        MAILROOM_DELIVERY__CLAIM_INTERVAL_MS="1000",
        MAILROOM_DELIVERY__LOCK_TTL_MS="3000",
        MAILROOM_DELIVERY__STALE_AFTER_S="5",
        MAILROOM_DELIVERY__READD_AFTER_S="5",
        MAILROOM_DELIVERY__BACKOFF_BASE_S="0.5",
        MAILROOM_DELIVERY__WEBHOOK_ACCOUNTS=json.dumps({"default": webhook.account()}),
        MAILROOM_DELIVERY__WEBHOOK_ALLOWED_HOSTS=json.dumps(["127.0.0.1"]),
        MAILROOM_DELIVERY__WEBHOOK_ALLOW_HTTP="true",
        MAILROOM_DELIVERY__ROUTES=json.dumps(
            [
                {"channel": "log", "recipient": "ops"},
                {"channel": "webhook", "recipient": "finance"},
            ]
        ),
        MAILROOM_SCHEDULER__LEADER_LOCK_KEY=str(int(tag, 16)),
        MAILROOM_SCHEDULER__LEADER_RETRY_S="0.5",
        MAILROOM_SCHEDULER__POLL_INTERVAL_S="1",
        MAILROOM_SCHEDULER__OUTBOX_SWEEP_INTERVAL_S="2",
        MAILROOM_SCHEDULER__WATCHDOG_INTERVAL_S="5",
        MAILROOM_SCHEDULER__STALE_DELIVERY_INTERVAL_S="2",
        MAILROOM_SCHEDULER__PENDING_DELIVERY_INTERVAL_S="2",
        MAILROOM_SCHEDULER__UNMAPPED_SWEEP_INTERVAL_S="5",
        MAILROOM_SCHEDULER__NOTIFICATION_SWEEP_INTERVAL_S="2",
        MAILROOM_SCHEDULER__BROKER_MAINTENANCE_INTERVAL_S="1",
    )
    env.update(overrides)
    return env
