"""Where the deliverer's CPU goes: its core in one process, against its protocol's floor.

``bench/delivery.py`` runs the deliverer as deployed (a Dramatiq worker beside Postgres,
Redis, the sink and the stream bridge) and finds it at its CPU bound. This script takes
Dramatiq and the other processes' share out, and runs in one process, on one event loop,
on embedded Postgres and Redis (durable) and the signature-checking sink of
``bench/http_baseline.py``, each in turn and alternating over the rounds:

* ``deliverer``: ``Deliverer.deliver_many`` on 8 batches of a stream read at a time (a worker's 8
  threads), webhook messages to the sink;
* ``steps``: the same with a channel that sends nothing: the deliverer's own steps (locks,
  claims, settlements, lease, lanes) without HTTP;
* ``floor``: the protocol stripped to one call per step per batch: one lock script, one
  claim statement, the webhook channel's sends, one settle statement, one settle script
  (no lanes, lease renewal, chunk plans, outcomes, metrics or account check);
* ``raw``: raw POSTs of the same bodies through the channel's session at the account's
  ``max_in_flight`` (``bench/http_baseline.py``).

Each prints messages per second and this process's CPU per message. A diagnostic: no
RESULT line. Usage: ``uv run python bench/delivery_core.py [--messages N] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import redis

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import durability  # noqa: E402
from delivery import delivered, insert_messages  # noqa: E402
from http_baseline import SinkProcess, posts  # noqa: E402

from mailroom.adapters.channels import register  # noqa: E402
from mailroom.db.migrate import upgrade  # noqa: E402
from mailroom.delivery.ports import Envelope  # noqa: E402
from mailroom.devtools.stack import EmbeddedPostgres, EmbeddedRedis  # noqa: E402
from mailroom.process import gc_policy  # noqa: E402
from mailroom.settings import DeliverySettings, WebhookAccount  # noqa: E402

#: Batches delivered at once (a worker's threads) and messages per batch (a stream read).
BATCHES, BATCH_SIZE = 8, DeliverySettings.model_fields["read_count"].default


@register("bench-null")
class NullChannel:
    """Sends nothing: what is left is the deliverer's own work."""

    def __init__(self, account: str, settings: DeliverySettings) -> None:
        self.account = account

    async def send(self, envelope: Envelope) -> str | None:
        return None

    async def aclose(self) -> None:
        return None


class Core:
    def __init__(self, state: Path, *, fast: bool) -> None:
        self.postgres = EmbeddedPostgres(state / "postgres", fast=fast, database="bench").start()
        self.redis_server = EmbeddedRedis(state / "redis").start()
        upgrade(self.postgres.url())
        self.sink = SinkProcess()
        os.environ.update(
            {
                **self.sink.env,
                "MAILROOM_DATABASE__URL": self.postgres.url(),
                "MAILROOM_REDIS__URL": self.redis_server.url,
                "MAILROOM_STATE_DIR": str(state / "mailroom"),
            }
        )
        self.db = psycopg.connect(self.postgres.dsn(), autocommit=True)

    def close(self) -> None:
        self.db.close()
        self.sink.stop()
        self.redis_server.stop()
        self.postgres.stop()

    def messages(self, count: int, channel: str) -> list[int]:
        """``count`` pending messages, nothing else in the table or in Redis."""
        self.db.execute("TRUNCATE channel_message RESTART IDENTITY CASCADE")
        with redis.Redis.from_url(self.redis_server.url) as client:
            client.flushdb()
        return insert_messages(self.db, count, channel)

    # -- the sides ---------------------------------------------------------------------------
    async def deliverer(self, ids: list[int]) -> tuple[float, float]:
        from actors.middleware.resources import Resources
        from mailroom.adapters.redis import DeliveryRedis
        from mailroom.delivery.deliver import Deliverer
        from mailroom.settings import Settings

        resources = Resources(Settings(), concurrency=BATCHES)
        try:
            settings = resources.settings.delivery
            outbound = await resources.channels()
            deliverer = Deliverer(
                sessions=await resources.sessions(),
                redis=DeliveryRedis(await resources.redis(), stream_key=settings.stream_key),
                outbound=outbound,
                settings=settings,
                refresh_accounts=outbound.refresh,
            )
            # Warm: every lane's path, the pools and the sink's connections, off the clock.
            await asyncio.gather(*(deliverer.deliver_many([mid]) for mid in ids[:BATCHES]))

            async def batch(chunk: list[int]) -> None:
                result = await deliverer.deliver_many(chunk)
                assert not result.retries, result.retries

            return await _timed(ids[BATCHES:], batch)
        finally:
            await resources.aclose()

    async def floor(self, ids: list[int]) -> tuple[float, float]:
        from mailroom.adapters.channels.webhook import WebhookChannel
        from mailroom.adapters.redis import DeliveryRedis
        from mailroom.adapters.redis_client import async_client
        from mailroom.delivery.chunks import SENT, ChunkPlan
        from mailroom.delivery.statements import CLAIM, SUCCEED
        from mailroom.settings import Settings

        settings = Settings()
        client = async_client(settings.stream_redis_url, settings.stream_redis)
        keys = DeliveryRedis(client, stream_key=settings.delivery.stream_key)
        channel = WebhookChannel("default", settings.delivery)
        # The record the deliverer settles a message sent whole with.
        plan = ChunkPlan(size=settings.delivery.chunk_size, texts=[""])
        plan.mark(1, SENT)
        sent_whole = plan.record()
        connections = [
            await psycopg.AsyncConnection.connect(self.postgres.dsn(), autocommit=True)
            for _ in range(BATCHES)
        ]
        free = list(connections)
        try:

            async def send(row: tuple[Any, ...]) -> None:
                # CLAIM returns the claim's fields in order: id, channel, account, recipient,
                # subject, body, attempts, ...
                message_id, name, account, recipient, subject, body = row[:6]
                envelope = Envelope(message_id, name, account, recipient, subject, body, 1, 1)
                await channel.send(envelope)

            async def batch(chunk: list[int]) -> None:
                connection = free.pop()
                try:
                    locks = await keys.acquire_locks(chunk, token="floor", ttl_ms=60_000)
                    ours = [mid for mid in chunk if locks[mid].ours]
                    claimed = await connection.execute(CLAIM, {"ids": ours, "due_slack_s": 1.0})
                    rows = await claimed.fetchall()
                    await asyncio.gather(*(send(row) for row in rows))
                    settled = json.dumps(
                        [{"id": row[0], "attempts": row[6], "chunks": sent_whole} for row in rows]
                    )
                    await (await connection.execute(SUCCEED, {"rows": settled})).fetchall()
                    await keys.settle_many(
                        [(row[0], "delivered") for row in rows], token="floor", delivered_ttl_s=60
                    )
                finally:
                    free.append(connection)

            await batch(ids[:BATCHES])  # warm, off the clock
            return await _timed(ids[BATCHES:], batch)
        finally:
            for connection in connections:
                await connection.close()
            await channel.aclose()
            await client.aclose()


async def _timed(
    ids: list[int], batch: Callable[[list[int]], Awaitable[None]]
) -> tuple[float, float]:
    """Runs ``batch`` over ``ids`` in batches, ``BATCHES`` at a time; returns the messages
    per second and the CPU seconds."""
    chunks = iter([ids[i : i + BATCH_SIZE] for i in range(0, len(ids), BATCH_SIZE)])

    async def lane() -> None:
        for chunk in chunks:
            await batch(chunk)

    began, started = time.perf_counter(), time.process_time()
    await asyncio.gather(*(lane() for _ in range(BATCHES)))
    return len(ids) / (time.perf_counter() - began), time.process_time() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per side and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each side once a round")
    durability.add_flags(parser)
    args = parser.parse_args()
    gc_policy.tune()  # as the deployed worker has it
    n = args.messages
    # The raw POSTs in flight: as many as the account's default lets the deliverer have.
    in_flight = WebhookAccount.model_fields["max_in_flight"].default
    figures: dict[str, list[tuple[float, float]]] = {}
    with durability.temporary_state(args, "mailroom-bench-delivery-core-") as state:
        core = Core(state, fast=args.fast)
        try:
            for _ in range(args.rounds):
                for side, channel, run in (
                    ("deliverer", "webhook", core.deliverer),
                    ("steps", "bench-null", core.deliverer),
                    ("floor", "webhook", core.floor),
                ):
                    ids = core.messages(n + BATCHES, channel)
                    figures.setdefault(side, []).append(asyncio.run(run(ids)))
                    if (done := delivered(core.db)) != n + BATCHES:  # the warm-up's too
                        raise SystemExit(f"{side}: {done} of {n + BATCHES} delivered")
                rate, cpu_s = asyncio.run(posts(core.sink.url, core.sink.secret, n, in_flight))
                figures.setdefault("raw", []).append((rate, cpu_s))
                print(
                    "round: "
                    + ", ".join(
                        f"{side} {runs[-1][0]:.0f}/s {runs[-1][1] * 1e6 / n:.0f} µs"
                        for side, runs in figures.items()
                    ),
                    flush=True,
                )
        finally:
            core.close()
    cores = len(os.sched_getaffinity(0))
    print(f"medians over {args.rounds} rounds, {n} messages a side, one process, {cores} cores:")
    raw_rate = statistics.median(rate for rate, _ in figures["raw"])
    for side, runs in figures.items():
        rate = statistics.median(r for r, _ in runs)
        cpu_us = statistics.median(c for _, c in runs) * 1e6 / n
        print(
            f"  {side:9s} {rate:7.0f} msg/s  {cpu_us:5.0f} µs CPU a message  {rate / raw_rate:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
