"""End-to-end latency: IMAP APPEND → notification delivered at the webhook sink.

Runs the whole system (worker, both bridges, scheduler, reference recognizer)
as real processes on embedded Postgres, Redis, NATS and pymap, IDLE on.

* latency: mails appended at a steady rate below capacity, one CSV each; for
  each, the time from its APPEND to its notification arriving at the webhook
  sink; p50, p95, p99.
* throughput: a burst of mails appended at once; mails per second until the last
  notification arrived.
* raw hops, measured in the same run: IMAP APPEND → FETCH of one mail, NATS
  request/reply, Redis LPUSH → BRPOP.

Usage: ``uv run python bench/e2e.py [--quick] [--mails N] [--rate R] [--burst N]``.
The last two lines are ``RESULT e2e_p50_s value=… target=1`` and
``RESULT e2e_p99_s value=… target=2``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mailroom.devtools.imap import DEMO_PASSWORD, DEMO_USER, ImapServer  # noqa: E402
from mailroom.devtools.seed import build_mail, invoice_csv  # noqa: E402
from mailroom.devtools.sinks import WebhookSink  # noqa: E402
from mailroom.devtools.stack import EmbeddedNats, EmbeddedPostgres, EmbeddedRedis  # noqa: E402
from mailroom.devtools.system import System, system_env  # noqa: E402
from mailroom.migrate import upgrade  # noqa: E402


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
        self.changed = threading.Condition()

    def __call__(self, line: str) -> None:
        subject = line.split(": ", 1)[1]
        with self.changed:
            self.times.setdefault(subject, time.monotonic())
            self.changed.notify_all()

    def wait(self, subjects: list[str], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while not all(s in self.times for s in subjects):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
        return True


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="finish within about a minute")
    parser.add_argument("--mails", type=int, default=None, help="latency sample size (>= 200)")
    parser.add_argument("--rate", type=float, default=None, help="mails appended per second")
    parser.add_argument("--burst", type=int, default=None, help="mails in the throughput burst")
    args = parser.parse_args()
    mails = max(200, args.mails or (200 if args.quick else 400))
    rate = args.rate or (15.0 if args.quick else 8.0)
    burst = args.burst or (60 if args.quick else 300)

    with tempfile.TemporaryDirectory(prefix="mailroom-bench-e2e-") as folder:
        base = Path(folder)
        postgres = EmbeddedPostgres(base / "postgres", fast=True).start()
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
                MAILROOM_LOG__LEVEL="WARNING",
            )
            (base / "logs").mkdir()
            from mailroom.db import libpq_dsn

            system = System(env, libpq_dsn(postgres.url()), "bench", imap, sink, base / "logs")
            system.start_all()
            appender = Appender(imap, "bench")

            # Warm up: the first mail pays for process start-up and connections.
            appender.append(mail("warm", 0))
            if not arrivals.wait(["warm-0"], 90):
                raise SystemExit("warm-up mail never arrived; see the logs")

            sent: dict[str, float] = {}
            interval = 1 / rate
            next_at = time.monotonic()
            for n in range(mails):
                subject = f"lat-{n}"
                sent[subject] = time.monotonic()
                appender.append(mail("lat", n))
                next_at += interval
                time.sleep(max(0.0, next_at - time.monotonic()))
            if not arrivals.wait(list(sent), 120):
                missing = [s for s in sent if s not in arrivals.times]
                raise SystemExit(f"{len(missing)} latency mails never arrived")
            latencies = [arrivals.times[s] - t for s, t in sent.items()]

            started = time.monotonic()
            subjects = [f"burst-{n}" for n in range(burst)]
            appender.append(*(mail("burst", n) for n in range(burst)))
            appender.close()
            if not arrivals.wait(subjects, 300):
                raise SystemExit("burst mails never all arrived")
            throughput = burst / (time.monotonic() - started)

            imap_ms = raw_imap_ms(imap, "raw", 20)
            nats_ms = asyncio.run(raw_nats_ms(nats_server.url, 100))
            redis_ms = raw_redis_ms(redis_server.url, 100)
        finally:
            if system is not None:
                system.stop()
            sink.stop()
            imap.stop()
            for server in (nats_server, redis_server, postgres):
                server.stop()

    p50, p95, p99 = (percentile(latencies, q) for q in (50, 95, 99))
    print(
        f"raw hops (median): IMAP append→fetch {imap_ms:.1f} ms, NATS request/reply "
        f"{nats_ms:.2f} ms, Redis enqueue→dequeue {redis_ms:.2f} ms"
    )
    print(
        f"latency over {mails} mails at {rate:g}/s: p50 {p50:.3f}s p95 {p95:.3f}s "
        f"p99 {p99:.3f}s (max {max(latencies):.3f}s)"
    )
    print(f"sustained: {burst} mails in a burst at {throughput:.1f} mails/s")
    print(f"RESULT e2e_p50_s value={p50:.3f} target=1")
    print(f"RESULT e2e_p99_s value={p99:.3f} target=2")


if __name__ == "__main__":
    main()
