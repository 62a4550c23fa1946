"""End to end: IMAP → webhook notification delivered, the whole system as real processes.

Runs every process ``mailroom dev`` runs (worker, both bridges, scheduler, reference
recognizer) with its defaults, on embedded Postgres, Redis, NATS and pymap, IDLE on.
Durable by default: Postgres with fsync and synchronous commit on, the object store
on disk; ``--fast`` turns fsync off and keeps everything in /dev/shm (the output says
which).

* backlog drain: N mails, one CSV each, are in the mailbox before the system starts;
  mails per second from start until every notification was delivered, divided by
  a raw IMAP fetch (imapclient, ``BODY.PEEK[]``) of the same mails in the same run, the
  mean of one before the system starts and one after it stopped.
  Each stage's rate during the drain and each process's CPU per mail are printed.
* latency at load: mails appended at half the measured drain rate; for each, the time
  from its APPEND to its notification arriving at the webhook sink; p50, p99.
* raw hops, measured in the same run: IMAP APPEND → FETCH of one mail, NATS
  request/reply, Redis LPUSH → BRPOP.

Usage: ``uv run python bench/e2e.py [--quick] [--fast] [--backlog N] [--mails N]``.
The last lines are ``RESULT e2e_backlog ratio=… target=0.1`` and
``RESULT e2e_p99_at_load_s value=… target=2``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import durability  # noqa: E402
from stages import ProcessCpu, StageTimes, machine_bound, outcome_line  # noqa: E402

from mailroom.db.migrate import upgrade  # noqa: E402
from mailroom.devtools.children import remove_folder  # noqa: E402
from mailroom.devtools.imap import DEMO_PASSWORD, DEMO_USER, ImapServer, demo_mailbox  # noqa: E402
from mailroom.devtools.seed import build_mail, invoice_csv  # noqa: E402
from mailroom.devtools.sinks import WebhookSink  # noqa: E402
from mailroom.devtools.stack import EmbeddedNats, EmbeddedPostgres, EmbeddedRedis  # noqa: E402
from mailroom.devtools.system import System, system_env  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class Appender:
    """APPENDs over one logged-in connection (a login per mail costs ~0.4 s on pymap)."""

    def __init__(self, imap: ImapServer, folder: str) -> None:
        from imapclient import IMAPClient

        self.folder = folder
        self.client = IMAPClient(imap.host, port=imap.port, ssl=False, timeout=10)
        self.client.login(DEMO_USER, DEMO_PASSWORD)

    def append(self, *mails: bytes) -> None:
        for raw in mails:
            self.client.append(self.folder, raw)

    def close(self) -> None:
        self.client.logout()


class Arrivals:
    """Arrival times at the sink, by mail subject."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.order: list[str] = []  # subjects as they first arrived
        self.changed = threading.Condition()

    def __call__(self, line: str) -> None:
        subject = line.split(": ", 1)[1]
        with self.changed:
            if subject not in self.times:
                self.times[subject] = time.monotonic()
                self.order.append(subject)
            self.changed.notify_all()

    def wait(self, subjects: list[str], timeout_s: float) -> bool:
        # Each wake-up looks only at the arrivals since the last one: the bench process
        # shares the cores with the system it measures.
        deadline = time.monotonic() + timeout_s
        missing, seen = set(subjects), 0
        with self.changed:
            while True:
                missing.difference_update(self.order[seen:])
                seen = len(self.order)
                if not missing:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)


def mail(tag: str, n: int) -> bytes:
    return build_mail(
        f"{tag}-{n}",
        [(f"invoice-{n}.csv", "text/csv", invoice_csv(n))],
        sender=f"supplier{n}@example.test",
    )


def raw_imap_ms(imap: ImapServer, folder: str, rounds: int) -> float:
    """APPEND one mail on one connection, then see and FETCH it on another."""
    from imapclient import IMAPClient

    appender = Appender(imap, folder)
    samples = []
    try:
        with IMAPClient(imap.host, port=imap.port, ssl=False, timeout=10) as client:
            client.login(DEMO_USER, DEMO_PASSWORD)
            client.select_folder(folder)
            for n in range(rounds):
                started = time.perf_counter()
                appender.append(mail("raw", n))
                client.noop()
                uids = client.search(["ALL"])
                client.fetch(uids[-1:], ["RFC822", "INTERNALDATE"])
                samples.append((time.perf_counter() - started) * 1000)
    finally:
        appender.close()
    return statistics.median(samples)


async def raw_nats_ms(url: str, rounds: int) -> float:
    import nats

    client = await nats.connect(url)
    try:

        async def reply(msg):  # type: ignore[no-untyped-def]
            await msg.respond(msg.data)

        await client.subscribe("bench.echo", cb=reply)
        samples = []
        for _ in range(rounds):
            started = time.perf_counter()
            await client.request("bench.echo", b"x" * 200, timeout=5)
            samples.append((time.perf_counter() - started) * 1000)
        return statistics.median(samples)
    finally:
        await client.close()


def raw_redis_ms(url: str, rounds: int) -> float:
    import redis

    client = redis.Redis.from_url(url)
    samples = []
    try:
        for n in range(rounds):
            started = time.perf_counter()
            client.lpush("bench:hop", n)
            client.brpop(["bench:hop"], timeout=5)
            samples.append((time.perf_counter() - started) * 1000)
    finally:
        client.close()
    return statistics.median(samples)


def fill_backlog(imap: ImapServer, folder: str, count: int) -> None:
    """Put ``count`` mails in the folder, 100 per MULTIAPPEND."""
    from imapclient import IMAPClient

    with IMAPClient(imap.host, port=imap.port, ssl=False, timeout=120) as client:
        client.login(DEMO_USER, DEMO_PASSWORD)
        for start in range(0, count, 100):
            client.multiappend(
                folder, [mail("backlog", n) for n in range(start, min(count, start + 100))]
            )


def raw_fetch_rate(imap: ImapServer, folder: str, count: int | None = None) -> float:
    """Mails per second of a bare imapclient FETCH of the folder's first ``count`` mails (all
    by default), 100 per command."""
    from imapclient import IMAPClient

    started = time.perf_counter()
    with IMAPClient(imap.host, port=imap.port, ssl=False, timeout=120) as client:
        client.login(DEMO_USER, DEMO_PASSWORD)
        client.select_folder(folder, readonly=True)
        uids = sorted(client.search(["ALL"]))[:count]
        fetched = 0
        for start in range(0, len(uids), 100):
            data = client.fetch(uids[start : start + 100], ["BODY.PEEK[]", "INTERNALDATE"])
            fetched += sum(1 for item in data.values() if item.get(b"BODY[]"))
    assert fetched == len(uids), (fetched, len(uids))
    return fetched / (time.perf_counter() - started)


#: Settings ``system_env`` shortens for fault tests; the benchmark runs their defaults.
TEST_TUNED = (
    "MAILROOM_BROKER__HEARTBEAT_TIMEOUT_MS",
    "MAILROOM_BROKER__MAINTENANCE_INTERVAL_S",
    "MAILROOM_RECOGNITION__ACK_TIMEOUT_S",
    "MAILROOM_RECOGNITION__SILENCE_AFTER_S",
    "MAILROOM_RECOGNITION__UNMAPPED_AFTER_S",
    "MAILROOM_NATS__BRIDGE_ACK_WAIT_S",
    "MAILROOM_INTAKE__LEASE_S",
    "MAILROOM_DELIVERY__CLAIM_IDLE_MS",
    "MAILROOM_DELIVERY__CLAIM_INTERVAL_MS",
    "MAILROOM_DELIVERY__LOCK_TTL_MS",
    "MAILROOM_DELIVERY__STALE_AFTER_S",
    "MAILROOM_DELIVERY__READD_AFTER_S",
    "MAILROOM_DELIVERY__BACKOFF_BASE_S",
)


def dev_defaults(env: dict[str, str], imap: ImapServer, folder: str) -> dict[str, str]:
    """``env`` with the settings ``mailroom dev`` runs: defaults, and its poll interval."""
    env = {
        k: v
        for k, v in env.items()
        if (k not in TEST_TUNED and not k.startswith("MAILROOM_SCHEDULER__"))
        or k.endswith("LOCK_KEY")
    }
    mailbox = {**demo_mailbox("e2e", imap.host, imap.port), "folder": folder, "idle": True}
    env["MAILROOM_INTAKE__MAILBOXES"] = json.dumps([mailbox])
    env["MAILROOM_SCHEDULER__POLL_INTERVAL_S"] = "5"  # as ``mailroom dev`` sets it
    return env


def server_pids(system: System, servers: dict[str, object]) -> dict[str, int]:
    pids = {c.name: c.process.pid for c in system.supervisor.children if c.process}
    for label, server in servers.items():
        process = getattr(server, "process", None)
        if process is not None:
            pids[label] = process.pid
    return pids


def cpu_bound_line(total_cpu_s: float, done: int, drain_rate: float, raw_rate: float) -> str:
    """The drain rate this run's CPU per mail allows on this machine's cores, if all were busy."""
    bound, cores = machine_bound(total_cpu_s, done)
    return (
        f"CPU bound on {cores} cores: {bound:.1f} mails/s = ratio {bound / raw_rate:.4f} "
        f"of the raw fetch; the drain reached {100 * drain_rate / bound:.0f} % of it"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="finish within about 3 minutes")
    durability.add_flags(parser)
    parser.add_argument("--backlog", type=int, default=None, help="mails in the backlog drain")
    parser.add_argument("--mails", type=int, default=None, help="latency sample size (>= 100)")
    parser.add_argument(
        "--rate", type=float, default=None, help="mails/s at load (default: half the drain rate)"
    )
    parser.add_argument(
        "--keep-logs", type=Path, default=None, help="copy the processes' logs to this folder"
    )
    args = parser.parse_args()
    backlog = args.backlog or (2_000 if args.quick else 20_000)
    mails = max(100, args.mails or (120 if args.quick else 1_000))
    base = durability.state_dir(args, "mailroom-bench-e2e-")
    try:
        postgres = EmbeddedPostgres(base / "postgres", fast=args.fast).start()
        redis_server = EmbeddedRedis(base / "redis").start()
        nats_server = EmbeddedNats(base / "nats").start()
        imap = ImapServer().start()
        arrivals = Arrivals()
        sink = WebhookSink(on_receive=arrivals).start()
        system: System | None = None
        try:
            upgrade(postgres.url())
            imap.create_folder("bench")
            imap.create_folder("raw")
            filled = time.monotonic()
            fill_backlog(imap, "bench", backlog)
            print(f"backlog of {backlog} mails appended in {time.monotonic() - filled:.1f}s")
            # The raw fetch runs before the system starts and again once it stopped, each time
            # with the machine to itself: one fetch alone moved between 759 and 1,591 mails/s
            # from run to run, as the host's speed moved, against a drain within 151-188.
            raw_before = raw_fetch_rate(imap, "bench")
            raw_after = 0.0
            env = system_env(
                database_url=postgres.url(),
                redis_url=redis_server.url,
                nats_url=nats_server.url,
                state_dir=base / "state",
                imap=imap,
                folder="bench",
                webhook=sink,
                MAILROOM_DELIVERY__ROUTES=json.dumps(
                    [{"channel": "webhook", "recipient": "bench", "subject": "{mail_subject}"}]
                ),
            )
            env = dev_defaults(env, imap, "bench")
            (base / "logs").mkdir()
            from mailroom.db.engine import libpq_dsn

            dsn = libpq_dsn(postgres.url())
            system = System(env, dsn, "bench", imap, sink, base / "logs")
            delivered = lambda: sum(1 for s in list(arrivals.times) if s.startswith("backlog-"))  # noqa: E731
            stages = StageTimes(dsn, "backlog-").start()
            started = time.monotonic()
            system.start_all()
            cpu = ProcessCpu(
                server_pids(
                    system, {"postgres": postgres, "redis": redis_server, "nats": nats_server}
                ),
                own={"bench (pymap, sink)": os.getpid()},
            )
            subjects = [f"backlog-{n}" for n in range(backlog)]
            drained = arrivals.wait(subjects, 100 if args.quick else 3_600)
            drain_s = time.monotonic() - started
            used = cpu.since_start()
            done = delivered()
            drain_rate = done / drain_s
            print(
                f"backlog drain: {done}/{backlog} delivered in {drain_s:.1f}s, {drain_rate:.1f} mails/s"
            )
            print("stage rates during the drain:")
            stages.collect(dict(arrivals.times))
            print("\n".join(stages.report(backlog)))
            print("\n".join(stages.timeline(5.0 if args.quick else 30.0)))
            print(outcome_line(dsn, "backlog-"))
            total_cpu = sum(used.values())
            print(
                f"CPU per mail by process (ms; {total_cpu:.1f} CPU s over {drain_s:.1f}s = {total_cpu / drain_s:.2f} cores):"
            )
            for label, seconds in sorted(used.items(), key=lambda kv: -kv[1]):
                print(f"  {label:<20} {seconds * 1000 / max(done, 1):7.2f}")
            latencies: list[float] = []
            rate = args.rate or max(1.0, drain_rate / 2)
            if not drained:
                print(
                    f"backlog drain incomplete: {done}/{backlog} delivered; the rate is of those, "
                    f"latency at load not measured; logs in {base / 'logs'}"
                )
            else:
                appender = Appender(imap, "bench")
                sent: dict[str, float] = {}
                interval = 1 / rate
                next_at = time.monotonic()
                for n in range(mails):
                    subject = f"lat-{n}"
                    sent[subject] = time.monotonic()
                    appender.append(mail("lat", n))
                    next_at += interval
                    time.sleep(max(0.0, next_at - time.monotonic()))
                appender.close()
                if not arrivals.wait(list(sent), 120):
                    missing = [s for s in sent if s not in arrivals.times]
                    raise SystemExit(f"{len(missing)} latency mails never arrived")
                latencies = [arrivals.times[s] - t for s, t in sent.items()]
            imap_ms = raw_imap_ms(imap, "raw", 20)
            nats_ms = asyncio.run(raw_nats_ms(nats_server.url, 100))
            redis_ms = raw_redis_ms(redis_server.url, 100)
            system.stop()  # again in ``finally``: a no-op then
            raw_after = raw_fetch_rate(imap, "bench", backlog)
        finally:
            if system is not None:
                system.stop()
                if args.keep_logs is not None:
                    shutil.copytree(base / "logs", args.keep_logs, dirs_exist_ok=True)
            sink.stop()
            imap.stop()
            for server in (nats_server, redis_server, postgres):
                server.stop()
    finally:
        remove_folder(base)

    print(
        f"raw hops (median): IMAP append→fetch {imap_ms:.1f} ms, NATS request/reply "
        f"{nats_ms:.2f} ms, Redis enqueue→dequeue {redis_ms:.2f} ms"
    )
    if latencies:
        p50, p99 = (percentile(latencies, q) for q in (50, 99))
        slowest = max(sent, key=lambda s: arrivals.times[s] - sent[s])
        print(
            f"latency at load, {mails} mails at {rate:.1f}/s (half the drain rate): "
            f"p50 {p50:.3f}s p99 {p99:.3f}s (max {max(latencies):.3f}s, {slowest})"
        )
    raw_rate = (raw_before + raw_after) / 2
    print(
        f"raw IMAP fetch of the backlog: {raw_before:.0f} mails/s before the system started, "
        f"{raw_after:.0f} after it stopped, {raw_rate:.0f} their mean"
    )
    print(cpu_bound_line(total_cpu, done, drain_rate, raw_rate))
    print(f"RESULT e2e_backlog ratio={drain_rate / raw_rate:.4f} target=0.1")
    if latencies:
        print(f"RESULT e2e_p99_at_load_s value={p99:.3f} target=2")


if __name__ == "__main__":
    main()
