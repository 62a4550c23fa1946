"""Soak: a steady flow of mail through the whole system while its processes are killed -9.

Runs the whole system (worker, NATS bridge, stream bridge, scheduler, reference
recognizer) as real processes on embedded Postgres, Redis (AOF on) and NATS
(JetStream), the dev IMAP server and a webhook sink, IDLE on, with two routes per
mail: ``log`` and ``webhook``. For ``--duration-s`` it APPENDs mails with one CSV
invoice each at ``--rate`` per second; every ``--kill-every-s`` a random process
(worker, either bridge, scheduler, recognizer) is SIGKILLed with its children and
started again at once, and once, halfway between two of those kills, Redis is
SIGKILLed and started again on the same port and data dir (AOF, so it comes back
with its data). Once, a fifth into the flow, the NATS bridge is SIGKILLed and kept
down for ``--bridge-down-s`` (25 s with ``--quick``, else 60 s), longer than the
reply deadline the run sets (5 s less) and than the no-ack window (20 s): the
recognizer's answers wait in JetStream meanwhile, and no mail may be told it
failed. A process that exits on its own is restarted as a supervisor would, and
counted. Then the flow stops and the system drains (at most
``--drain-s``); the final count is taken 5 s after, so a late re-send is counted.

**Lost** counts appended mails (each known by its UID from APPENDUID) that did not
reach their effect or a stated terminal state. A mail is *not* lost when the
cursor is ``blocked`` at its UID or below (the cursor states the reason), or when
all of these hold:

1. it has an ``inbound_mail`` row, and the row is ``final``;
2. every one of its ``stored_file`` rows has a final status (RECOGNIZED,
   NEEDS_CHECK, ERROR, SKIPPED);
3. it is notified (``notified_at``), and for each route there is a
   ``channel_message`` under the dedupe key of its current final state
   (``mail:{id}:final:{finalized_at ms}:route:{n}``) in a final status (delivered,
   partial_failed, failed, uncertain);
4. its ``delivered`` webhook message reached the sink (``Idempotency-Key``
   ``{message id}:1`` was received);
5. its file's current job is not ``dlq`` (NO_ACK) while the recognizer's log says
   it published an answer for that job and attempt: an answer must win over the
   outbox's guess. A ``dlq`` job the recognizer never answered (it was down for
   longer than the no-ack window) is a stated terminal state.

**Duplicates** is the sum of

* webhook POSTs at the receiver beyond the first per ``Idempotency-Key``;
* ``inbound_mail`` rows beyond the first per (cursor, uidvalidity, uid), and per
  (cursor, Message-ID);
* ``document`` rows beyond the first per recognition job;
* ``channel_message`` rows beyond the first per dedupe key.

**Renotified** counts mails with more than one notification on a route: a mail
first notified under one final state and then under another (failed, then
recognized once the answer was read) was told something untrue first.

Outcomes that are stated but not the effect (files in ERROR, jobs in ``dlq`` or
``timeout``, messages ``uncertain`` or ``failed``) are printed as the breakdown.

Usage: ``uv run python bench/soak.py [--quick] [--duration-s S] [--rate R]
[--kill-every-s S] [--bridge-down-s S] [--drain-s S] [--seed N] [--keep]``. ``--quick`` finishes in
under two minutes on an idle machine (a 40 s flow, a kill every 8 s, at most 90 s
to drain); the default flow lasts 5 minutes with a kill every 30 s. On a busy
machine a killed process takes long to start again (importing the worker costs
seconds of CPU), which the drain waits out. The state dir (logs of every process)
is kept with ``--keep``, or when something was lost or duplicated or a process
exited on its own. The last three lines are ``RESULT soak_lost value=… target=0``,
``RESULT soak_duplicates value=… target=0`` and ``RESULT soak_renotified value=… target=0``.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import durability  # noqa: E402

from mailroom.db.engine import libpq_dsn  # noqa: E402
from mailroom.db.migrate import upgrade  # noqa: E402
from mailroom.db.models import FINAL_FILE_STATUSES, FINAL_MESSAGE_STATUSES  # noqa: E402
from mailroom.devtools.children import remove_folder  # noqa: E402
from mailroom.devtools.imap import DEMO_PASSWORD, DEMO_USER, ImapServer  # noqa: E402
from mailroom.devtools.seed import invoice_mails  # noqa: E402
from mailroom.devtools.sinks import WebhookSink  # noqa: E402
from mailroom.devtools.stack import EmbeddedNats, EmbeddedPostgres, EmbeddedRedis  # noqa: E402
from mailroom.devtools.system import System, system_env  # noqa: E402

FOLDER = "soak"
#: What is killed, by process name of ``process_specs``.
TARGETS = ("worker", "worker-intake", "bridge-nats", "bridge-stream", "scheduler", "recognizer")
ROUTES = [{"channel": "log", "recipient": "ops"}, {"channel": "webhook", "recipient": "finance"}]
WEBHOOK_ROUTE = 1
#: The reference recognizer's log line for an answer it published (and flushed).
ANSWERED = re.compile(r"service: job ([0-9a-f-]{36}) attempt (\d+) answered")
#: Mails notified more than once on one route (each final state has its own dedupe key).
RENOTIFIED = """
    SELECT count(DISTINCT mail_id) FROM (
        SELECT mail_id FROM channel_message WHERE mail_id IS NOT NULL
         GROUP BY mail_id, channel HAVING count(*) > 1
    ) AS twice
"""
#: How long the check waits after the drain before its final count.
SETTLE_S = 5.0


class Appender:
    """APPENDs over one logged-in connection, reconnecting after an error."""

    def __init__(self, imap: ImapServer, folder: str) -> None:
        self.imap = imap
        self.folder = folder
        self.client: Any = None

    def append(self, raw: bytes) -> int:
        from imapclient import IMAPClient

        if self.client is None:
            self.client = IMAPClient(self.imap.host, port=self.imap.port, ssl=False, timeout=10)
            self.client.login(DEMO_USER, DEMO_PASSWORD)
        try:
            response = self.client.append(self.folder, raw)
        except Exception:
            self.close()
            raise
        match = re.search(rb"APPENDUID \d+ (\d+)", response)
        assert match, response
        return int(match.group(1))

    def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            try:
                client.logout()
            except Exception:
                client.shutdown()


@dataclass
class Check:
    """Where every appended mail stands, and the duplicates found."""

    missing: Counter[str] = field(default_factory=Counter)
    blocked: int = 0
    duplicates: Counter[str] = field(default_factory=Counter)
    breakdown: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def lost(self) -> int:
        return sum(self.missing.values())


def check(system: System, uids: list[int]) -> Check:
    result = Check()
    cursor = system.query(
        "SELECT status, blocked_uid FROM mailbox_cursor WHERE folder = %s", FOLDER
    )
    blocked_uid = cursor[0][1] if cursor and cursor[0][0] == "blocked" else None
    mails = {
        uid: (mail_id, status, notified, finalized)
        for mail_id, uid, status, notified, finalized in system.query(
            "SELECT id, uid, status, notified_at IS NOT NULL, finalized_at FROM inbound_mail"
        )
    }
    open_files = Counter(
        mail_id
        for (mail_id,) in system.query(
            "SELECT mail_id FROM stored_file WHERE NOT status = ANY(%s)", list(FINAL_FILE_STATUSES)
        )
    )
    messages = {
        key: (message_id, channel, status)
        for message_id, key, channel, status in system.query(
            "SELECT id, dedupe_key, channel, status FROM channel_message"
        )
    }
    received = system.webhook.posts_per_key()
    answered = _answered(system.logs / "recognizer.log")
    dead_answered = {
        mail_id
        for mail_id, job_id, attempt in system.query(
            "SELECT f.mail_id, j.id::text, j.attempt FROM stored_file AS f"
            " JOIN recognition_job AS j ON j.id = f.current_recognition_job_id"
            " WHERE j.status = 'dlq'"
        )
        if (job_id, attempt) in answered
    }
    for uid in uids:
        if blocked_uid is not None and uid >= blocked_uid:
            result.blocked += 1
        elif (reason := _missing(mails.get(uid), open_files, messages, received)) is not None:
            result.missing[reason] += 1
        elif mails[uid][0] in dead_answered:
            result.missing["answered, yet dead-lettered"] += 1
    result.duplicates["webhook posts"] = sum(n - 1 for n in received.values())
    duplicate_sql = {
        "mails per (cursor, uidvalidity, uid)": "inbound_mail GROUP BY cursor_id, uidvalidity, uid",
        "mails per (cursor, Message-ID)": "inbound_mail WHERE message_id IS NOT NULL"
        " GROUP BY cursor_id, message_id",
        "documents per job": "document GROUP BY job_id",
        "notifications per dedupe key": "channel_message WHERE dedupe_key IS NOT NULL"
        " GROUP BY dedupe_key",
    }
    for what, source in duplicate_sql.items():
        result.duplicates[what] = system.scalar(
            f"SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM {source}) AS t"
        )
    breakdown = {
        "mails": "SELECT status, count(*) FROM inbound_mail GROUP BY 1",
        "files": "SELECT status, count(*) FROM stored_file GROUP BY 1",
        "jobs": "SELECT status, count(*) FROM recognition_job GROUP BY 1",
        "documents": "SELECT status, count(*) FROM document GROUP BY 1",
        "messages": "SELECT channel || ' ' || status, count(*) FROM channel_message GROUP BY 1",
    }
    result.breakdown = {what: dict(sorted(system.query(sql))) for what, sql in breakdown.items()}
    return result


def _answered(log: Path) -> set[tuple[str, int]]:
    """(job id, attempt) of every answer the reference recognizer published, from its log."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return set()
    return {(job, int(attempt)) for job, attempt in ANSWERED.findall(text)}


def _missing(
    mail: tuple[int, str, bool, datetime | None] | None,
    open_files: Counter[int],
    messages: dict[str, tuple[int, str, str]],
    received: Counter[str],
) -> str | None:
    """What an appended mail still lacks to count as done, or None."""
    if mail is None:
        return "no mail row"
    mail_id, status, notified, finalized = mail
    if status != "final" or finalized is None:
        return f"mail {status}"
    if open_files[mail_id]:
        return "file not final"
    if not notified:
        return "final, not notified"
    state = int(finalized.timestamp() * 1000)  # as mailroom/notifications/passes.py keys it
    for number in range(len(ROUTES)):
        message = messages.get(f"mail:{mail_id}:final:{state}:route:{number}")
        if message is None:
            return "no message for its final state"
        message_id, _, status = message
        if status not in FINAL_MESSAGE_STATUSES:
            return f"message {status}"
        if number == WEBHOOK_ROUTE and status == "delivered" and not received[f"{message_id}:1"]:
            return "webhook delivered, not received"
    return None


@dataclass
class Flow:
    appended: list[int] = field(default_factory=list)
    append_errors: int = 0
    kills: list[tuple[float, str]] = field(default_factory=list)
    crashes: Counter[str] = field(default_factory=Counter)


def run_flow(
    system: System,
    redis_server: EmbeddedRedis,
    *,
    duration_s: float,
    rate: float,
    kill_every_s: float,
    bridge_down_s: float,
    rng: random.Random,
) -> Flow:
    flow = Flow()
    appender = Appender(system.imap, FOLDER)
    kill_times = [kill_every_s * k for k in range(1, int(duration_s / kill_every_s) + 1)]
    kill_times = [t for t in kill_times if t < duration_s]
    # Redis once, halfway between two process kills in the middle of the run.
    redis_at = kill_every_s * (len(kill_times) // 2 + 0.5)
    # The NATS bridge once, down for longer than the reply deadline.
    bridge_down: float | None = duration_s / 5
    bridge_up: float | None = None
    started = time.monotonic()
    next_mail = started
    number = 0
    try:
        while (now := time.monotonic()) - started < duration_s:
            elapsed = now - started
            if bridge_down is not None and elapsed >= bridge_down:
                bridge_down, bridge_up = None, elapsed + bridge_down_s
                system.kill("bridge-nats")
                flow.kills.append((elapsed, "bridge-nats (outage)"))
                print(f"  {elapsed:6.1f}s kill -9 bridge-nats for {bridge_down_s:g} s", flush=True)
            if bridge_up is not None and elapsed >= bridge_up:
                bridge_up = None
                system.start("bridge-nats")
                print(f"  {elapsed:6.1f}s bridge-nats started again", flush=True)
            if kill_times and elapsed >= kill_times[0]:
                kill_times.pop(0)
                down = [] if bridge_up is None else ["bridge-nats"]
                target = rng.choice([t for t in TARGETS if t not in down])
                if system.child(target).process is None:  # died, waiting for its restart
                    system.supervisor.children.remove(system.child(target))
                else:
                    system.kill(target)
                system.start(target)
                flow.kills.append((elapsed, target))
                print(f"  {elapsed:6.1f}s kill -9 {target}; restarted", flush=True)
            if redis_at is not None and elapsed >= redis_at:
                redis_at = None
                redis_server.kill_and_restart(down_s=1.0)
                flow.kills.append((elapsed, "redis"))
                print(f"  {elapsed:6.1f}s kill -9 redis; restarted after 1 s", flush=True)
            for child in system.supervisor.children:
                if child.process is not None and child.process.poll() is not None:
                    flow.crashes[child.name] += 1
            system.supervisor.check()  # restarts what died on its own, as a supervisor would
            if now >= next_mail:
                number += 1
                (raw,) = invoice_mails(number, 1, tag="Soak")
                try:
                    flow.appended.append(appender.append(raw))
                except Exception as exc:
                    flow.append_errors += 1
                    print(f"  append failed ({exc!r}); the mail is not counted", flush=True)
                next_mail += 1 / rate
            time.sleep(max(0.0, min(next_mail - time.monotonic(), 0.2)))
    finally:
        appender.close()
        if bridge_up is not None:  # the flow ended first: the drain needs a bridge
            system.start("bridge-nats")
    return flow


def warm_up(system: System) -> tuple[int, float]:
    """One mail through to the webhook: every process is up and connected (slow on a busy machine)."""
    (uid,) = system.append(*invoice_mails(0, 1, tag="Warm-up"))
    waited = system.wait_for("the warm-up mail", lambda: bool(system.webhook.received), 180)
    return uid, waited


def drain(system: System, uids: list[int], timeout_s: float) -> tuple[float, Check]:
    started = time.monotonic()
    shown = 0.0
    while True:
        system.supervisor.check()
        result = check(system, uids)
        waited = time.monotonic() - started
        if result.lost == 0 or waited > timeout_s:
            time.sleep(SETTLE_S)  # a late re-send still counts
            return waited, check(system, uids)
        if waited - shown >= 5:
            shown = waited
            left = ", ".join(f"{w} {n}" for w, n in result.missing.items())
            print(f"  draining, {waited:4.0f}s: {left}", flush=True)
        time.sleep(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="finish in under two minutes")
    parser.add_argument("--duration-s", type=float, default=None, help="length of the flow")
    parser.add_argument("--rate", type=float, default=None, help="mails appended per second")
    parser.add_argument("--kill-every-s", type=float, default=None, help="period of the kills")
    parser.add_argument(
        "--bridge-down-s", type=float, default=None, help="length of the NATS bridge's outage"
    )
    parser.add_argument("--drain-s", type=float, default=None, help="longest wait to drain")
    parser.add_argument("--seed", type=int, default=None, help="seed of the kill choices")
    parser.add_argument("--keep", action="store_true", help="keep the state dir and logs")
    durability.add_flags(parser)
    args = parser.parse_args()
    duration_s = args.duration_s or (40.0 if args.quick else 300.0)
    rate = args.rate or 2.0
    kill_every_s = args.kill_every_s or (8.0 if args.quick else 30.0)
    bridge_down_s = args.bridge_down_s or (25.0 if args.quick else 60.0)
    drain_s = args.drain_s or (90.0 if args.quick else 240.0)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)

    base = durability.state_dir(args, "mailroom-soak-")
    clock = time.monotonic()
    postgres = EmbeddedPostgres(base / "postgres", fast=args.fast).start()
    redis_server = EmbeddedRedis(base / "redis").start()
    nats_server = EmbeddedNats(base / "nats").start()
    imap = ImapServer().start()
    sink = WebhookSink().start()
    system: System | None = None
    try:
        upgrade(postgres.url())
        imap.create_folder(FOLDER)
        env = system_env(
            database_url=postgres.url(),
            redis_url=redis_server.url,
            nats_url=nats_server.url,
            state_dir=base / "state",
            imap=imap,
            folder=FOLDER,
            webhook=sink,
            MAILROOM_DELIVERY__ROUTES=json.dumps(ROUTES),
            # Shorter than the bridge's outage, so the outage outlasts it.
            MAILROOM_RECOGNITION__REPLY_DEADLINE_S=str(max(1.0, bridge_down_s - 5)),
        )
        (base / "logs").mkdir()
        system = System(env, libpq_dsn(postgres.url()), FOLDER, imap, sink, base / "logs")
        system.start_all()
        warm_uid, warm_s = warm_up(system)
        print(f"warm-up mail through in {warm_s:.1f} s", flush=True)
        print(
            f"soak: {duration_s:g} s at {rate:g} mails/s, a kill every {kill_every_s:g} s, "
            f"seed {seed}, state {base}",
            flush=True,
        )
        flow = run_flow(
            system,
            redis_server,
            duration_s=duration_s,
            rate=rate,
            kill_every_s=kill_every_s,
            bridge_down_s=bridge_down_s,
            rng=rng,
        )
        drained_s, result = drain(system, [warm_uid, *flow.appended], drain_s)
        renotified = int(system.scalar(RENOTIFIED))
    finally:
        if system is not None:
            system.stop()
        sink.stop()
        imap.stop()
        for server in (nats_server, redis_server, postgres):
            server.stop()
    total_s = time.monotonic() - clock

    killed = Counter(target.split(" ")[0] for _, target in flow.kills)
    duplicates = sum(result.duplicates.values())
    print(
        f"flow: {len(flow.appended)} mails appended in {duration_s:g} s (and 1 warm-up mail) "
        f"({flow.append_errors} appends failed), drained in {drained_s:.1f} s, "
        f"{total_s:.0f} s in all"
    )
    print(
        f"kills: {len(flow.kills)} ("
        + ", ".join(f"{name} {n}" for name, n in sorted(killed.items()))
        + "): "
        + ", ".join(f"{target}@{at:.0f}s" for at, target in flow.kills)
    )
    if flow.crashes:
        print(
            "exited on their own and restarted: "
            + ", ".join(f"{name} {n}" for name, n in sorted(flow.crashes.items()))
        )
    for what, counts in result.breakdown.items():
        print(f"{what}: " + (", ".join(f"{s} {n}" for s, n in counts.items()) or "-"))
    print(f"blocked at the cursor (stated terminal): {result.blocked}")
    print("lost: " + (", ".join(f"{w} {n}" for w, n in result.missing.items()) or "none"))
    print("duplicates: " + ", ".join(f"{w} {n}" for w, n in result.duplicates.items()))
    print(f"mails notified more than once on a route: {renotified}")
    if args.keep or result.lost or duplicates or renotified or flow.crashes:
        print(f"state and logs kept in {base}")
    else:
        remove_folder(base)
    print(f"RESULT soak_lost value={result.lost} target=0")
    print(f"RESULT soak_duplicates value={duplicates} target=0")
    print(f"RESULT soak_renotified value={renotified} target=0")


if __name__ == "__main__":
    main()
