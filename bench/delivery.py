"""Delivery benchmark: end-to-end delivery vs a no-op actor, and the stream bridge vs a bare loop.

Runs on embedded Postgres and Redis (``mailroom.devtools.stack``) with Dramatiq's
RedisBroker. Workers are one ``dramatiq actors`` pool per configuration
(processes x threads 1x8 and 2x8) consuming both the ``system`` and the
``delivery`` queue, so both measurements run on the same worker processes:

* no-op drain: a queue of ``actors.system.noop`` messages filled before the pool
  starts, from the first message consumed to the last acknowledged;
* delivery: pending ``log`` messages in Postgres with their ids put on the stream
  once the pool is warm; a ``mailroom bridge stream`` subprocess (started with
  the pool) feeds the workers; from the first message delivered to the last
  ``delivered`` row;
* bridge ingest: ``StreamBridge`` against a bare loop of batched XREADGROUP +
  one ``deliver_channel_messages`` enqueue per read + pipelined XACK, both in
  this process on a pre-filled stream, alternating, best of three each.

Usage: ``uv run python bench/delivery.py [--quick] [--messages N]``. The last two
lines are ``RESULT delivery ratio=… target=0.6`` and ``RESULT bridge ratio=… target=0.8``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import durability  # noqa: E402

from mailroom.devtools.stack import EmbeddedPostgres, EmbeddedRedis  # noqa: E402
from mailroom.migrate import upgrade  # noqa: E402

#: Longest any one measurement may take before the run is declared stuck, in seconds.
STUCK_AFTER_S = 300.0
POLL_S = 0.01
CONFIGS = ((1, 8), (2, 8))
#: Messages per measurement of a full run, and of ``--quick`` (which must end within a minute).
FULL_MESSAGES = 50_000
QUICK_MESSAGES = 10_000
#: Fewest runs of each ingest measurement (short ones, so noisy), best taken.
INGEST_ROUNDS = 3


def phases(**seconds: float) -> None:
    print(
        "    " + ", ".join(f"{name} {value:.1f} s" for name, value in seconds.items()), flush=True
    )


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = STUCK_AFTER_S) -> float:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench stuck waiting for {what}")
        time.sleep(POLL_S)
    return time.perf_counter()


class Bench:
    def __init__(self, state: Path, messages: int, *, fast: bool) -> None:
        self.messages = messages
        self.postgres = EmbeddedPostgres(state / "postgres", fast=fast, database="bench").start()
        self.redis_server = EmbeddedRedis(state / "redis").start()
        upgrade(self.postgres.url())
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")},
            "MAILROOM_DATABASE__URL": self.postgres.url(),
            "MAILROOM_DATABASE__POOL_SIZE": "10",
            "MAILROOM_REDIS__URL": self.redis_server.url,
            "MAILROOM_BROKER__KIND": "redis",
            "MAILROOM_LOG__LEVEL": "WARNING",
            "MAILROOM_STATE_DIR": str(state / "mailroom"),
        }
        os.environ.update(self.env)  # this process builds the same broker
        import actors  # noqa: F401  (sets the RedisBroker from the environment)
        from actors.delivery import deliver_channel_message, deliver_channel_messages
        from actors.system import noop

        self.deliver = deliver_channel_message
        self.deliver_batch = deliver_channel_messages
        self.noop = noop
        self.redis = redis.Redis.from_url(self.redis_server.url)
        self.db = psycopg.connect(self.postgres.dsn(), autocommit=True)

    def close(self) -> None:
        import dramatiq

        dramatiq.get_broker().close()
        self.redis.close()
        self.db.close()
        self.redis_server.stop()
        self.postgres.stop()

    # -- helpers -------------------------------------------------------------------------------
    def reset(self) -> None:
        self.redis.flushdb()
        self.db.execute("TRUNCATE channel_message RESTART IDENTITY CASCADE")

    def spawn(self, args: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, *args],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def workers(self, queues: list[str], processes: int, threads: int) -> subprocess.Popen[bytes]:
        return self.spawn(
            [
                "-m",
                "dramatiq",
                "actors",
                "--queues",
                *queues,
                "-p",
                str(processes),
                "-t",
                str(threads),
                "--skip-logging",
            ]
        )

    @staticmethod
    def stop(*processes: subprocess.Popen[bytes]) -> float:
        """SIGTERM each (at once), wait for all; returns the seconds it took."""
        began = time.perf_counter()
        for process in processes:
            if process.poll() is None:
                # The master forwards SIGTERM to its workers; a second one from a group kill
                # makes Dramatiq's workers hang until killed.
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(max(1.0, 30 - (time.perf_counter() - began)))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        return time.perf_counter() - began

    def insert_messages(self, count: int) -> list[int]:
        rows = self.db.execute(
            "INSERT INTO channel_message (channel, account, recipient, body, status) "
            "SELECT 'log', 'default', 'bench', 'hello ' || g, 'pending' "
            "FROM generate_series(1, %s) AS g RETURNING id",
            (count,),
        ).fetchall()
        return [row[0] for row in rows]

    def fill_stream(self, ids: list[int]) -> None:
        from mailroom.delivery.contracts import encode_entry
        from mailroom.settings import DeliverySettings

        key = DeliverySettings().stream_key
        pipe = self.redis.pipeline(transaction=False)
        for message_id in ids:
            pipe.xadd(key, encode_entry(message_id))  # type: ignore[arg-type]
        pipe.execute()

    def delivered(self) -> int:
        return int(
            self.db.execute(
                "SELECT count(*) FROM channel_message WHERE status = 'delivered'"
            ).fetchone()[0]  # type: ignore[index]
        )

    def still_open(self) -> int:
        """Messages not settled yet: cheap to poll (a partial index holds only open ones)."""
        return int(
            self.db.execute(
                "SELECT count(*) FROM channel_message WHERE status IN ('pending', 'sending')"
            ).fetchone()[0]  # type: ignore[index]
        )

    def bridge_ready(self) -> bool:
        from mailroom.settings import DeliverySettings

        settings = DeliverySettings()
        try:
            groups = self.redis.xinfo_groups(settings.stream_key)
        except redis.exceptions.ResponseError:  # no stream yet
            return False
        return any(
            g["name"] in (settings.consumer_group, settings.consumer_group.encode()) for g in groups
        )

    def fill_noop_queue(self, count: int) -> None:
        """Enqueue ``count`` no-ops from a few threads (each send is one Redis round trip)."""
        with ThreadPoolExecutor(4) as pool:
            for _ in pool.map(lambda _: self.noop.send(), range(count), chunksize=250):
                pass

    # -- measurements --------------------------------------------------------------------------
    def measure(self, processes: int, threads: int) -> tuple[float, float]:
        """No-op drain and end-to-end delivery on one worker pool: (no-op, delivery) msg/s."""
        self.reset()
        n = self.messages
        began = time.perf_counter()
        # The bridge boots while the queue fills; it is idle (blocked on the empty stream)
        # before the workers start, so it takes nothing from the no-op measurement.
        bridge = self.spawn(["-c", "from mailroom.cli import app; app()", "bridge", "stream"])
        workers = None
        try:
            self.fill_noop_queue(n)
            [probe] = self.insert_messages(1)
            ids = self.insert_messages(n)
            filled = time.perf_counter()
            wait_for(self.bridge_ready, "the bridge", 60)
            ready = time.perf_counter()
            key = f"dramatiq:{self.noop.queue_name}.msgs"
            workers = self.workers(
                [self.noop.queue_name, self.deliver.queue_name], processes, threads
            )
            start = wait_for(lambda: self.redis.hlen(key) < n, "the first no-op")
            end = wait_for(lambda: self.redis.hlen(key) == 0, "the no-op drain")
            noop = n / (end - start)
            phases(fill=filled - began, bridge=ready - filled, boot=start - ready, noop=end - start)
            # Warm-up: every worker thread has run the delivery code before the clock starts.
            for _ in range(processes * threads):
                self.deliver.send(probe)
            wait_for(lambda: self.delivered() == 1, "the warm-up delivery", 60)
            warm, drained = time.perf_counter(), end
            self.fill_stream(ids)
            start = wait_for(lambda: self.still_open() < n, "the first delivery")
            end = wait_for(lambda: self.still_open() == 0, "all deliveries")
            if self.delivered() != n + 1:
                raise SystemExit(f"only {self.delivered() - 1} of {n} messages were delivered")
            phases(warm_up=warm - drained, first=start - warm, delivery=end - start)
            return noop, n / (end - start)
        finally:
            stopped = self.stop(bridge, *([workers] if workers else []))
            phases(stop=stopped, total=time.perf_counter() - began)

    def bare_ingest(self) -> float:
        from mailroom.settings import DeliverySettings

        settings = DeliverySettings()
        key, group = settings.stream_key, settings.consumer_group
        self._prepare_ingest()
        done = 0
        start = time.perf_counter()
        while done < self.messages:
            reply: Any = self.redis.xreadgroup(group, "bare", {key: ">"}, count=settings.read_count)
            entries = [entry for _, batch in reply for entry in batch]
            # One actor message per read, as the bridge sends.
            self.deliver_batch.send([json.loads(f[b"payload"])["message_id"] for _, f in entries])
            pipe = self.redis.pipeline(transaction=False)
            pipe.xack(key, group, *[entry_id for entry_id, _ in entries])
            pipe.execute()
            done += len(entries)
        return self.messages / (time.perf_counter() - start)

    def bridge_ingest(self) -> float:
        from bridges.stream import StreamBridge, create_client
        from mailroom.settings import DeliverySettings

        settings = DeliverySettings()
        self._prepare_ingest()

        n = self.messages

        class Timed(StreamBridge):
            async def handle(self, entries: Any, *, defer_ack: bool = False) -> bool:
                handled = await super().handle(entries, defer_ack=defer_ack)
                if self.forwarded >= n:
                    self.stop.set()  # run() returns once every entry is acknowledged
                return handled

        async def run() -> float:
            client = create_client(self.redis_server.url, settings)
            bridge = Timed(client, settings=settings, send=self.deliver_batch.send, consumer="b")
            await bridge.ensure_group()
            start = time.perf_counter()
            try:
                await bridge.run()
                # The clock stops at the last acknowledgement, as in the bare loop.
                ended = time.perf_counter()
            finally:
                await client.aclose()
            return n / (ended - start)

        return asyncio.run(run())

    def _prepare_ingest(self) -> None:
        from mailroom.settings import DeliverySettings

        settings = DeliverySettings()
        self.redis.flushdb()
        self.fill_stream(list(range(1, self.messages + 1)))
        self.redis.xgroup_create(settings.stream_key, settings.consumer_group, id="0")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round, within a minute")
    parser.add_argument("--messages", type=int, default=None, help="messages per measurement")
    parser.add_argument("--rounds", type=int, default=1, help="best of this many runs each")
    durability.add_flags(parser)
    args = parser.parse_args()
    messages = args.messages or (QUICK_MESSAGES if args.quick else FULL_MESSAGES)
    rounds = args.rounds
    with durability.temporary_state(args, "mailroom-bench-delivery-") as state:
        began = time.perf_counter()
        bench = Bench(state, messages, fast=args.fast)
        print(f"services up in {time.perf_counter() - began:.1f} s", flush=True)
        try:
            print(f"messages per measurement: {messages}; rounds: {rounds}", flush=True)
            delivery_ratios = []
            for processes, threads in CONFIGS:
                runs = [bench.measure(processes, threads) for _ in range(rounds)]
                noop = max(noop for noop, _ in runs)
                rate = max(rate for _, rate in runs)
                print(f"no-op drain      {processes}x{threads}: {noop:8.0f} msg/s", flush=True)
                print(f"delivery e2e     {processes}x{threads}: {rate:8.0f} msg/s", flush=True)
                delivery_ratios.append(rate / noop)
            bare = bridge = 0.0
            # Each ingest run lasts well under a second, so a burst of load from elsewhere
            # decides a single one: both sides take their best of several, alternating.
            for _ in range(max(INGEST_ROUNDS, rounds)):
                bare = max(bare, bench.bare_ingest())
                bridge = max(bridge, bench.bridge_ingest())
            print(f"bare ingest loop:      {bare:8.0f} entries/s", flush=True)
            print(f"stream bridge ingest:  {bridge:8.0f} entries/s", flush=True)
        finally:
            bench.close()
        print(f"elapsed: {time.perf_counter() - began:.1f} s")
        for (processes, threads), ratio in zip(CONFIGS, delivery_ratios, strict=True):
            print(f"delivery/no-op {processes}x{threads}: {ratio:.2f}")
        print(f"RESULT delivery ratio={min(delivery_ratios):.2f} target=0.6")
        print(f"RESULT bridge ratio={bridge / bare:.2f} target=0.8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
