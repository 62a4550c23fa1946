"""Intake at scale: 1,000 watched folders across 50 accounts on Dovecot, quiet, then a trickle.

Dovecot (its default per-user connection limit, ``mail_max_userip_connections`` 10) holds
50 accounts of 20 folders each; intake runs as compose runs it (an intake worker, the IMAP
watcher, the scheduler at its 30 s pass, production defaults otherwise). Once every folder
is watched, the intake processes' CPU is measured while nothing arrives; then mail is
appended at a steady rate into random folders, and each mail's APPEND → stored time is its
row's ``created_at`` less the moment its APPEND returned (one host, one clock). Polls are
counted by a trigger on the cursor's claims. ``--watchers 2 --kill-one`` runs two watchers
and SIGKILLs one halfway through the trickle: the other takes its accounts over within a
lease, so no mail waits longer than a lease plus a pass.

Usage: ``uv run python bench/intake_scale.py [--quick] [--watchers N] [--kill-one]``. The
last lines are ``RESULT intake_watch_p99_s value=… target=2`` and
``RESULT intake_quiet_cpu_pct value=… target=10``.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import durability  # noqa: E402
import psutil  # noqa: E402
import psycopg  # noqa: E402
from e2e import TEST_TUNED, mail  # noqa: E402
from imapclient import IMAPClient  # noqa: E402
from stages import ProcessCpu  # noqa: E402

from mailroom.db.engine import libpq_dsn  # noqa: E402
from mailroom.db.migrate import upgrade  # noqa: E402
from mailroom.devtools.dovecot import (  # noqa: E402
    DovecotServer,
    dovecot_version,
    find_dovecot,
    server_folder,
)
from mailroom.devtools.sinks import WebhookSink  # noqa: E402
from mailroom.devtools.stack import EmbeddedPostgres, EmbeddedRedis  # noqa: E402
from mailroom.devtools.system import System, system_env  # noqa: E402

#: The intake processes whose CPU counts, as ``mailroom dev`` names them.
INTAKE = ("worker-intake", "scheduler")
#: Counts each claim of a cursor (a poll that runs): a new lease.
POLL_COUNTER = """
CREATE TABLE bench_polls (n bigint NOT NULL);
INSERT INTO bench_polls VALUES (0);
CREATE FUNCTION bench_count_poll() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.lease_id IS NOT NULL AND NEW.lease_id IS DISTINCT FROM OLD.lease_id THEN
    UPDATE bench_polls SET n = n + 1;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER bench_count_poll AFTER UPDATE ON mailbox_cursor
  FOR EACH ROW EXECUTE FUNCTION bench_count_poll();
"""


def store_mailboxes(database_url: str, key: str, mailboxes: list[dict[str, object]]) -> None:
    """The mailboxes as operator rows of the runtime table, as an operator with 1,000 would
    keep them (the environment has room for a few dozen: one variable is at most 128 KiB)."""
    import asyncio

    from pydantic import SecretStr

    from mailroom.config_store import admin
    from mailroom.db.engine import create_engine, create_sessionmaker
    from mailroom.settings import DatabaseSettings, RuntimeConfigSettings, Settings

    settings = Settings(
        database=DatabaseSettings(url=database_url),
        runtime_config=RuntimeConfigSettings(key=SecretStr(key)),
    )

    async def add_all() -> None:
        engine = create_engine(settings.database)
        try:
            async with create_sessionmaker(engine)() as session, session.begin():
                for mailbox in mailboxes:
                    config = {k: v for k, v in mailbox.items() if k != "name"}
                    await admin.add(
                        session,
                        settings,
                        kind="mailbox",
                        name=str(mailbox["name"]),
                        config=config,
                        operator="bench",
                    )
        finally:
            await engine.dispose()

    asyncio.run(add_all())


def create_accounts(imap: DovecotServer, accounts: int, folders: int) -> list[dict[str, object]]:
    """``folders`` folders for each of the ``accounts`` users; their mailbox settings (all
    watched)."""
    mailboxes = []
    for a in range(accounts):
        user, password = f"user{a:02d}", f"pw{a:02d}"
        with IMAPClient(imap.host, port=imap.port, ssl=False, timeout=60) as client:
            client.login(user, password)
            for f in range(folders):
                client.create_folder(f"f{f:02d}")
                mailboxes.append(
                    {
                        "name": f"{user}-f{f:02d}",
                        "host": imap.host,
                        "port": imap.port,
                        "security": "plain",
                        "username": user,
                        "password": password,
                        "folder": f"f{f:02d}",
                        "idle": True,
                    }
                )
    return mailboxes


class Appender:
    """APPENDs, each on a connection of its own; when each returned, by (mailbox, uid).

    None is kept between APPENDs: the bench's own logins stay off the accounts' connection
    count (Dovecot's ``mail_max_userip_connections``) that the intake processes share.
    """

    def __init__(self, imap: DovecotServer, accounts: int) -> None:
        self.imap = imap
        self.clients: dict[int, IMAPClient] = {}  # none kept
        self.appended: dict[tuple[str, int], float] = {}

    def append(self, account: int, folder: int, n: int) -> None:
        with IMAPClient(self.imap.host, port=self.imap.port, ssl=False, timeout=60) as client:
            client.login(f"user{account:02d}", f"pw{account:02d}")
            response = client.append(f"f{folder:02d}", mail(f"scale-{n}", n))
            returned = time.time()
        match = re.search(rb"APPENDUID \d+ (\d+)", response)
        assert match, response
        self.appended[(f"user{account:02d}-f{folder:02d}", int(match.group(1)))] = returned

    def close(self) -> None:
        return None


def imap_connections(port: int) -> int:
    """Established TCP connections to the IMAP port, from any process of this host."""
    return sum(
        1
        for c in psutil.net_connections("tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short quiet phase and trickle")
    parser.add_argument("--accounts", type=int, default=50)
    parser.add_argument("--folders", type=int, default=20, help="folders per account")
    parser.add_argument("--rate", type=float, default=1.0, help="mails a second in the trickle")
    parser.add_argument("--watchers", type=int, default=1)
    parser.add_argument("--kill-one", action="store_true", help="SIGKILL a watcher midway")
    parser.add_argument("--keep-logs", type=Path, default=None)
    parser.add_argument("--trickle-s", type=float, default=None, help="length of the trickle")
    parser.add_argument("--log-level", default="INFO", help="the intake processes' log level")
    durability.add_flags(parser)
    args = parser.parse_args()
    quiet_s, trickle_s = (20.0, 45.0) if args.quick else (60.0, 600.0)
    trickle_s = args.trickle_s or trickle_s
    dovecot = find_dovecot()
    if dovecot is None:
        raise SystemExit("Dovecot is not installed (apt-get install dovecot-imapd)")
    with (
        durability.temporary_state(args, "mailroom-bench-scale-") as base,
        server_folder("mailroom-bench-dovecot-") as dovecot_folder,
    ):
        postgres = EmbeddedPostgres(base / "postgres", fast=args.fast).start()
        redis_server = EmbeddedRedis(base / "redis").start()
        imap = DovecotServer(dovecot, dovecot_folder)
        for a in range(args.accounts):
            imap.add_user(f"user{a:02d}", f"pw{a:02d}")
        imap.start()
        sink = WebhookSink().start()
        system: System | None = None
        appender: Appender | None = None
        print(f"IMAP server: {dovecot_version(dovecot)}", flush=True)
        try:
            upgrade(postgres.url())
            dsn = libpq_dsn(postgres.url())
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(POLL_COUNTER)
            made = time.monotonic()
            mailboxes = create_accounts(imap, args.accounts, args.folders)
            print(
                f"{len(mailboxes)} folders of {args.accounts} accounts made in "
                f"{time.monotonic() - made:.0f} s",
                flush=True,
            )
            env = system_env(
                database_url=postgres.url(),
                redis_url=redis_server.url,
                nats_url="nats://127.0.0.1:4222",  # nothing downstream of intake runs
                state_dir=base / "state",
                imap=imap,  # type: ignore[arg-type]
                folder="f00",
                webhook=sink,
            )
            # Production defaults: the test harness's tuned intervals go, the pass is 30 s.
            env = {
                k: v
                for k, v in env.items()
                if (k not in TEST_TUNED and not k.startswith("MAILROOM_SCHEDULER__"))
                or k.endswith("LOCK_KEY")
            }
            from cryptography.fernet import Fernet

            key = Fernet.generate_key().decode()
            store_mailboxes(postgres.url(), key, mailboxes)
            env["MAILROOM_RUNTIME_CONFIG__KEY"] = key
            env["MAILROOM_INTAKE__MAILBOXES"] = "[]"
            env["MAILROOM_LOG__LEVEL"] = args.log_level
            (base / "logs").mkdir()
            system = System(env, dsn, "f00", imap, sink, base / "logs")  # type: ignore[arg-type]
            for name in INTAKE:
                system.start(name)
            watchers = [f"bridge-imap-{n}" for n in range(args.watchers)]
            for label in watchers:
                system.start("bridge-imap", label=label)
            watch = psycopg.connect(dsn, autocommit=True)
            started = time.monotonic()
            while True:
                watched = watch.execute(
                    "SELECT count(*) FROM mailbox_cursor WHERE watched_until > now()"
                ).fetchone()[0]
                if watched >= len(mailboxes):
                    break
                if time.monotonic() - started > 240:
                    raise SystemExit(f"only {watched} of {len(mailboxes)} folders watched in 240 s")
                time.sleep(1)
            print(
                f"all {len(mailboxes)} folders watched {time.monotonic() - started:.0f} s "
                "after start",
                flush=True,
            )
            time.sleep(10)  # the first polls of every folder end

            def polls() -> int:
                return int(watch.execute("SELECT n FROM bench_polls").fetchone()[0])

            def pg_connections() -> int:
                row = watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                ).fetchone()
                return int(row[0]) - 1  # the bench's own

            intake_pids = {c.name: c.process.pid for c in system.supervisor.children if c.process}
            cpu = ProcessCpu(intake_pids)
            polls_before, quiet_started = polls(), time.monotonic()
            time.sleep(quiet_s)
            quiet_cpu = cpu.since_start()
            quiet_elapsed = time.monotonic() - quiet_started
            quiet_polls = polls() - polls_before
            quiet_pct = 100 * sum(quiet_cpu.values()) / quiet_elapsed
            print(
                f"quiet {quiet_elapsed:.0f} s: {quiet_polls * 60 / quiet_elapsed:.1f} polls/min, "
                f"IMAP connections {imap_connections(imap.port)}, "
                f"Postgres connections {pg_connections()}",
                flush=True,
            )
            for label, seconds in sorted(quiet_cpu.items()):
                print(f"  CPU {label:<16} {100 * seconds / quiet_elapsed:5.1f} % of a core")

            appender = Appender(imap, args.accounts)
            rng = random.Random(40)
            polls_before, trickle_started = polls(), time.monotonic()
            killed = False
            n = 0
            while (elapsed := time.monotonic() - trickle_started) < trickle_s:
                if args.kill_one and not killed and elapsed >= trickle_s / 2 and len(watchers) > 1:
                    system.kill(watchers[0])
                    killed = True
                    print(f"{elapsed:.0f} s: {watchers[0]} SIGKILLed", flush=True)
                appender.append(rng.randrange(args.accounts), rng.randrange(args.folders), n)
                n += 1
                time.sleep(max(0.0, trickle_started + n / args.rate - time.monotonic()))
            trickle_polls = polls() - polls_before
            connections = imap_connections(imap.port) - len(appender.clients)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                stored = watch.execute("SELECT count(*) FROM inbound_mail").fetchone()[0]
                if stored >= len(appender.appended):
                    break
                time.sleep(0.5)
            rows = watch.execute(
                "SELECT c.mailbox, m.uid, EXTRACT(EPOCH FROM m.created_at) "
                "FROM inbound_mail m JOIN mailbox_cursor c ON c.id = m.cursor_id"
            ).fetchall()
            waits = [
                float(created) - appender.appended[(mailbox, uid)]
                for mailbox, uid, created in rows
                if (mailbox, uid) in appender.appended
            ]
            print(
                f"trickle {trickle_s:.0f} s at {args.rate:g} mail/s: {len(appender.appended)} "
                f"appended, {len(waits)} stored; {trickle_polls * 60 / trickle_s:.1f} polls/min, "
                f"IMAP connections {connections} (the bench's appenders left out), "
                f"Postgres connections {pg_connections()}",
                flush=True,
            )
            if len(waits) < len(appender.appended):
                raise SystemExit(f"{len(appender.appended) - len(waits)} mails never stored")
            p50, p99 = statistics.median(waits), percentile(waits, 0.99)
            print(f"APPEND -> stored: p50 {p50:.2f} s, p99 {p99:.2f} s, max {max(waits):.2f} s")
            if args.kill_one:
                bound = 30 + 30  # a watcher lease (intake.watch_lease_s) plus a pass
                print(
                    f"with a watcher SIGKILLed: longest wait {max(waits):.1f} s "
                    f"(bound: a lease plus a pass, {bound} s)"
                )
            watch.close()
        finally:
            if appender is not None:
                appender.close()
            if system is not None:
                system.stop()
                if args.keep_logs is not None:
                    import shutil

                    shutil.copytree(base / "logs", args.keep_logs, dirs_exist_ok=True)
                    shutil.copy(dovecot_folder / "dovecot.log", args.keep_logs)
            sink.stop()
            imap.stop()
            for server in (redis_server, postgres):
                server.stop()
    print(f"RESULT intake_watch_p99_s value={p99:.2f} target=2")
    print(f"RESULT intake_quiet_cpu_pct value={quiet_pct:.1f} target=10")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
