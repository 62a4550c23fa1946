"""Cluster soak: a steady flow of mail through the whole system while a node of each server dies.

Runs the whole system (worker, NATS bridge, stream bridge, scheduler, reference recognizer)
as real processes on three clusters built on loopback (``mailroom/devtools/clusters.py``):
three NATS servers with the recognition stream at three replicas, a Redis primary with a
replica and three sentinels, and a Postgres primary with a synchronous streaming standby;
the dev IMAP server and a webhook sink, two routes per mail (``log`` and ``webhook``).
For ``--duration-s`` it APPENDs mails with one CSV invoice each at ``--rate`` per second;
every ``--kill-every-s`` one node is SIGKILLed, the kinds in turn:

* NATS: the server that leads the stream, started again ``RESTART_AFTER_S`` later;
* Redis: the master the sentinels name, started again later (the sentinels make it a
  replica of the promoted one);
* Postgres: the primary; the standby is promoted at once (``pg_ctl promote``) and a new
  standby is cloned from it where the old primary was.

Then the flow stops and the system drains (at most ``--drain-s``). Lost and duplicated are
counted as ``bench/soak.py`` counts them (its docstring says what each means).

Usage: ``uv run python bench/cluster_soak.py [--quick] [--duration-s S] [--rate R]
[--kill-every-s S] [--drain-s S] [--keep]``. ``--quick``: a 60 s flow with a kill every 9 s
(each kind twice). The default: 300 s with a kill every 30 s (each kind at least three
times). The last two lines are ``RESULT cluster_soak_lost value=… target=0`` and
``RESULT cluster_soak_duplicates value=… target=0``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import durability  # noqa: E402
from soak import FOLDER, ROUTES, Appender, Check, drain, warm_up  # noqa: E402

from mailroom.db.dsn import psycopg_dsn  # noqa: E402
from mailroom.db.engine import database_url  # noqa: E402
from mailroom.db.migrate import upgrade  # noqa: E402
from mailroom.devtools.children import remove_folder  # noqa: E402
from mailroom.devtools.clusters import (  # noqa: E402
    REDIS_MASTER_NAME,
    NatsCluster,
    PostgresPair,
    RedisSentinelGroup,
)
from mailroom.devtools.imap import ImapServer  # noqa: E402
from mailroom.devtools.seed import invoice_mails  # noqa: E402
from mailroom.devtools.sinks import WebhookSink  # noqa: E402
from mailroom.devtools.system import System, system_env  # noqa: E402
from mailroom.settings import DatabaseSettings  # noqa: E402

#: Fixed loopback ports of the three clusters (below the ephemeral range).
NATS_BASE_PORT, REDIS_BASE_PORT, POSTGRES_BASE_PORT = 25200, 25300, 25400
#: How long a killed NATS or Redis node stays down, in seconds.
RESTART_AFTER_S = 3.0
#: The node kinds, killed in this order.
KINDS = ("nats", "redis", "postgres")


class Clusters:
    """The three clusters, and the one kill of each kind."""

    def __init__(self, base: Path) -> None:
        self.nats = NatsCluster(base / "nats", base_port=NATS_BASE_PORT)
        self.redis = RedisSentinelGroup(base / "redis", base_port=REDIS_BASE_PORT)
        self.postgres = PostgresPair(base / "postgres", base_port=POSTGRES_BASE_PORT)
        #: (when, node) of the nodes to start again.
        self.down: list[tuple[float, object]] = []

    def start(self) -> None:
        self.nats.start()
        self.redis.start()
        self.postgres.start()

    def stop(self) -> None:
        self.nats.stop()
        self.redis.stop()
        self.postgres.stop()

    @property
    def database(self) -> DatabaseSettings:
        return DatabaseSettings(
            url="postgresql+psycopg://postgres@unused/mailroom", hosts=self.postgres.hosts
        )

    def kill(self, kind: str, stream: str) -> str:
        """SIGKILL one node of ``kind``; what was killed."""
        if kind == "nats":
            node = self.nats.node(_stream_leader(self.nats, stream) or self.nats.nodes[0].node)
            node.kill()
            self.down.append((time.monotonic() + RESTART_AFTER_S, node))
            return f"nats {node.node}"
        if kind == "redis":
            master = self.redis.master()
            master.kill()
            self.down.append((time.monotonic() + RESTART_AFTER_S, master))
            return f"redis {master.node}"
        old = self.postgres.primary.port
        self.postgres.fail_over()
        return f"postgres :{old}"

    def restart_due(self) -> None:
        now = time.monotonic()
        for entry in [entry for entry in self.down if entry[0] <= now]:
            self.down.remove(entry)
            node = entry[1]
            node.stop()  # type: ignore[attr-defined]
            node.start()  # type: ignore[attr-defined]


def _stream_leader(cluster: NatsCluster, stream: str) -> str | None:
    """The server that leads ``stream``, from a running server's ``/jsz?streams=1``."""
    import urllib.request

    for node in cluster.nodes:
        if node.process is None:
            continue
        url = f"http://127.0.0.1:{node.http_port}/jsz?streams=true"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                report = json.load(response)
        except (OSError, ValueError):
            continue
        for account in report.get("account_details", []):
            for detail in account.get("stream_detail", []):
                if detail.get("name") == stream:
                    leader = detail.get("cluster", {}).get("leader")
                    return str(leader) if leader else None
    return None


def run_flow(
    system: System, clusters: Clusters, *, duration_s: float, rate: float, kill_every_s: float
) -> tuple[list[int], list[tuple[float, str]], int]:
    """Append at ``rate`` for ``duration_s``, killing a node every ``kill_every_s``."""
    appender = Appender(system.imap, FOLDER)
    appended: list[int] = []
    kills: list[tuple[float, str]] = []
    errors = 0
    stream = system.env["MAILROOM_NATS__STREAM_NAME"]
    started = time.monotonic()
    next_mail, next_kill, number = started, started + kill_every_s, 0
    try:
        while (now := time.monotonic()) - started < duration_s:
            clusters.restart_due()
            system.supervisor.check()
            if now >= next_kill:
                kind = KINDS[len(kills) % len(KINDS)]
                what = clusters.kill(kind, stream)
                kills.append((now - started, what))
                print(f"  {now - started:6.1f}s kill -9 {what}", flush=True)
                next_kill += kill_every_s
            if now >= next_mail:
                number += 1
                (raw,) = invoice_mails(number, 1, tag="ClusterSoak")
                try:
                    appended.append(appender.append(raw))
                except Exception as exc:
                    errors += 1
                    print(f"  append failed ({exc!r}); the mail is not counted", flush=True)
                next_mail += 1 / rate
            time.sleep(max(0.0, min(next_mail - time.monotonic(), 0.2)))
    finally:
        appender.close()
    while clusters.down:  # every node back before the drain
        time.sleep(0.2)
        clusters.restart_due()
    return appended, kills, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 60 s flow, each kind twice")
    parser.add_argument("--duration-s", type=float, default=None, help="length of the flow")
    parser.add_argument("--rate", type=float, default=None, help="mails appended per second")
    parser.add_argument("--kill-every-s", type=float, default=None, help="period of the kills")
    parser.add_argument("--drain-s", type=float, default=None, help="longest wait to drain")
    parser.add_argument("--keep", action="store_true", help="keep the state dir and logs")
    durability.add_flags(parser)
    args = parser.parse_args()
    duration_s = args.duration_s or (60.0 if args.quick else 300.0)
    rate = args.rate or 2.0
    kill_every_s = args.kill_every_s or (9.0 if args.quick else 30.0)
    drain_s = args.drain_s or (90.0 if args.quick else 240.0)

    base = durability.state_dir(args, "mailroom-cluster-soak-")
    clock = time.monotonic()
    clusters = Clusters(base)
    imap = ImapServer().start()
    sink = WebhookSink().start()
    system: System | None = None
    try:
        clusters.start()
        database = clusters.database
        upgrade(database_url(database))
        imap.create_folder(FOLDER)
        env = system_env(
            database_url=database_url(database),
            redis_url=clusters.redis.url(),
            nats_url=clusters.nats.urls[0],
            state_dir=base / "state",
            imap=imap,
            folder=FOLDER,
            webhook=sink,
            MAILROOM_DELIVERY__ROUTES=json.dumps(ROUTES),
            MAILROOM_NATS__SERVERS=json.dumps(clusters.nats.urls),
            MAILROOM_NATS__STREAM_REPLICAS="3",
            MAILROOM_REDIS__SENTINELS=json.dumps(clusters.redis.sentinel_addresses),
            MAILROOM_REDIS__SENTINEL_MASTER=REDIS_MASTER_NAME,
            MAILROOM_REDIS__RETRY_ATTEMPTS="8",
        )
        (base / "logs").mkdir()
        system = System(env, psycopg_dsn(database), FOLDER, imap, sink, base / "logs")
        system.start_all()
        warm_uid, warm_s = warm_up(system)
        print(f"warm-up mail through in {warm_s:.1f} s", flush=True)
        print(
            f"cluster soak: {duration_s:g} s at {rate:g} mails/s, a kill every "
            f"{kill_every_s:g} s, state {base}",
            flush=True,
        )
        appended, kills, errors = run_flow(
            system, clusters, duration_s=duration_s, rate=rate, kill_every_s=kill_every_s
        )
        drained_s, result = drain(system, [warm_uid, *appended], drain_s)
    finally:
        if system is not None:
            system.stop()
        sink.stop()
        imap.stop()
        clusters.stop()
    report(result, appended, kills, errors, drained_s, time.monotonic() - clock)
    if args.keep or result.lost or sum(result.duplicates.values()):
        print(f"state and logs kept in {base}")
    else:
        remove_folder(base)
    print(f"RESULT cluster_soak_lost value={result.lost} target=0")
    print(f"RESULT cluster_soak_duplicates value={sum(result.duplicates.values())} target=0")


def report(
    result: Check,
    appended: list[int],
    kills: list[tuple[float, str]],
    errors: int,
    drained_s: float,
    total_s: float,
) -> None:
    killed = Counter(what.split(" ")[0] for _, what in kills)
    print(
        f"flow: {len(appended)} mails appended (and 1 warm-up mail) ({errors} appends failed), "
        f"drained in {drained_s:.1f} s, {total_s:.0f} s in all"
    )
    print(
        f"kills: {len(kills)} ("
        + ", ".join(f"{name} {n}" for name, n in sorted(killed.items()))
        + "): "
        + ", ".join(f"{what}@{at:.0f}s" for at, what in kills)
    )
    for what, counts in result.breakdown.items():
        print(f"{what}: " + (", ".join(f"{s} {n}" for s, n in counts.items()) or "-"))
    print("lost: " + (", ".join(f"{w} {n}" for w, n in result.missing.items()) or "none"))
    print("duplicates: " + ", ".join(f"{w} {n}" for w, n in result.duplicates.items()))


if __name__ == "__main__":
    main()
