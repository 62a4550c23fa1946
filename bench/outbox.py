"""Recognition benchmark: the outbox publisher vs a one-job relay, the inbox vs a no-op actor.

Runs on embedded Postgres, NATS and Redis (``mailroom.devtools.stack``, Postgres with
durable by default: fsync on for both sides alike, ``--fast`` turns it off), migrated fresh:

* outbox: 20,000 queued jobs (never fewer). (a) a one-job-per-transaction relay
  (``bench/baselines.py``'s relay with a batch of one: claim the oldest row with SKIP
  LOCKED, publish on core NATS, flush, update, commit),
  time-boxed, then all rows reset to queued; (b) Mailroom's
  ``publish_recognition_requests`` passes (core NATS) until every job is published.
  No service answers here, and flow control publishes at most a window
  (``max_unacked_per_pipeline``) of unacked requests: the bench acks what each pass or
  batched loop's batch published, right after it, as a prompt service would
  (``baselines.ack``, one statement a batch), on both sides alike; the one-job relay
  is not acked (it never fills a window), which only lowers the publisher's ratio.
* inbox: N ``done`` results pre-loaded into JetStream; a ``mailroom bridge nats``
  subprocess feeds the inbox's worker as deployed: Dramatiq's CLI as ``mailroom worker
  -Q inbox`` runs it (``mailroom.process.dramatiq_main``, RedisBroker), with the processes and
  threads of ``mailroom dev`` and the compose stack (2 x 8), running
  ``apply_recognition_messages`` (batches the bridge formed)
  against Postgres; every result must be applied. Each worker process times its
  batches (``bench/inbox_hooks.py``), and the bridge starts once they consume.
  Baseline, per result too: the same bridge, batching and workers with a no-op handler
  (the batch messages are acked without running the actor). Both rates are measured
  alike: every result, over the time from the bridge's first batch (the actor message's
  enqueue time) to the last batch finished, so neither the bridge's start nor a lucky
  first or last batch sets the figure; ``--quick`` still carries 10,000 results (about
  100 batches). The inbox runs twice (its jobs put back to waiting between), the
  baseline just before, between and just after (each run reads every result again), and
  the ratio takes the means, so a change of load or of the host's speed between runs
  weighs on both sides; each run also prints the CPU per result of the bridge, workers
  and Postgres.
* outbox, fairer baseline: a batched claim-and-publish loop without the protocol
  (``bench/baselines.py``), ``RESULT outbox_batched ratio=… target=0.8``. Its batch is
  what one pass takes, the smaller of the publish batch and the window (the loop at the
  full publish batch is printed beside it when they differ). It runs just before and just
  after the publisher and the ratio takes their mean (the inbox brackets its runs alike).

``--prefill`` lets the bridge enqueue every result before the workers start, to
see the actor's own rate (from the first worker process's start). Usage:
``uv run python bench/outbox.py [--quick] [--jobs N] [--results N] [--prefill]``. The
last lines are ``RESULT outbox ratio=… target=10``, ``RESULT outbox_batched ratio=… target=0.8``
and ``RESULT inbox ratio=… target=0.5``.
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
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import baselines  # noqa: E402
import durability  # noqa: E402
from stages import ProcessCpu  # noqa: E402

from mailroom.db.migrate import upgrade  # noqa: E402
from mailroom.devtools.children import remove_folder, spawn, throwaway_folder  # noqa: E402
from mailroom.devtools.dev import WORKER_PROCESSES, WORKER_THREADS  # noqa: E402
from mailroom.devtools.stack import EmbeddedNats, EmbeddedPostgres, EmbeddedRedis  # noqa: E402
from mailroom.recognition.inbox.sql import WRITTEN  # noqa: E402

#: The outbox part never runs on fewer queued jobs than this.
MIN_JOBS = 20_000
STUCK_AFTER_S = 300.0


def wait_for(
    condition: Callable[[], bool],
    what: str,
    timeout_s: float = STUCK_AFTER_S,
    poll_s: float = 0.01,
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench stuck waiting for {what}")
        time.sleep(poll_s)


def insert_jobs(dsn: str, count: int) -> None:
    """One mail, ``count`` files each with its stored object and a queued job (set-based).

    Each file has its own object, as intake stores them: the object table is as large as
    the file table when analyzed, so the planner looks objects up by index (the inbox's
    foreign-key check on a result object seq-scanned a one-row table growing under it).
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO mailbox_cursor (mailbox, folder) VALUES ('bench', 'INBOX')")
        conn.execute(
            "INSERT INTO inbound_mail (cursor_id, uidvalidity, uid, status) "
            "SELECT id, 1, 1, 'stored' FROM mailbox_cursor"
        )
        conn.execute(
            """
            INSERT INTO stored_object (bucket_role, bucket, key, created_by)
            SELECT 'incoming', 'mailroom-incoming', 'bench/file-' || n || '.csv', 'bench'
              FROM generate_series(1, %s) AS n
            """,
            (count,),
        )
        conn.execute(
            """
            INSERT INTO stored_file (mail_id, object_id, original_name, file_type, status)
            SELECT (SELECT id FROM inbound_mail), o.id, 'file-' || o.id || '.csv', 'csv', 'UPLOADED'
              FROM stored_object AS o
            """
        )
        conn.execute(
            """
            INSERT INTO recognition_job (id, file_id, pipeline, status, attempt, request_msg_id)
            SELECT u.id, u.file_id, 'tabular', 'queued', 1, u.id || ':1:request'
              FROM (SELECT gen_random_uuid() AS id, id AS file_id FROM stored_file) AS u
            """
        )
        conn.execute(
            "UPDATE stored_file AS f SET current_recognition_job_id = j.id "
            "FROM recognition_job AS j WHERE j.file_id = f.id"
        )
        conn.execute("ANALYZE")


def reset_jobs(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE recognition_job SET status = 'queued', published_at = NULL, "
            "started_at = NULL, reply_deadline = NULL, request_subject = NULL"
        )
        conn.execute("VACUUM ANALYZE recognition_job")


def unack_jobs(dsn: str) -> None:
    """The bench's acks taken back: every job waits for its answer as ``published``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE recognition_job SET status = 'published', started_at = NULL "
            "WHERE status = 'processing'"
        )


def batched_loop(settings: Any, dsn: str, size: int, when: str) -> float:
    """The batched claim-and-publish loop over every job, queued again first; jobs/s."""
    reset_jobs(dsn)
    batched, batched_s = asyncio.run(baselines.relay(settings, size))
    rate = batched / batched_s
    print(
        f"batched claim-and-publish loop, {when}: {batched} jobs in {batched_s:.2f}s = "
        f"{rate:.0f} jobs/s (batch {size}, no protocol, acked)"
    )
    return rate


async def mailroom_publisher(settings: Any) -> tuple[int, float]:
    """Mailroom's outbox passes, each acked (``baselines.ack``), until nothing is left;
    (jobs, elapsed)."""
    from mailroom.adapters.nats import NatsClient
    from mailroom.db.engine import create_engine, create_sessionmaker
    from mailroom.recognition.outbox.relay import publish_recognition_requests

    engine = create_engine(settings.database)
    sessions = create_sessionmaker(engine)
    client = NatsClient(settings.nats)
    await client.connect()
    done = 0
    started = time.perf_counter()
    try:
        while True:
            outcome = await publish_recognition_requests(
                sessions, client, nats=settings.nats, recognition=settings.recognition
            )
            if outcome.error:
                raise SystemExit(f"publish failed: {outcome.error}")
            done += len(outcome.published)
            await baselines.ack(sessions, outcome.published)
            if not outcome.claimed:
                break
        return done, time.perf_counter() - started
    finally:
        await client.close()
        await engine.dispose()


async def preload_results(settings: Any, dsn: str, count: int) -> None:
    """``count`` done results for published jobs, stored in JetStream before the bridge starts."""
    from mailroom.adapters.nats import NatsClient, OutgoingMessage

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT id, file_id FROM recognition_job WHERE status = 'published' ORDER BY id LIMIT %s",
            (count,),
        ).fetchall()
    client = NatsClient(settings.nats)
    await client.connect()
    subject = settings.nats.subject(settings.nats.results_subject)
    try:
        messages = [
            OutgoingMessage(
                subject=subject,
                msg_id=f"{job_id}:1:result",
                data=json.dumps(
                    {
                        "schema_version": "1.0",
                        "job_id": str(job_id),
                        "file_id": file_id,
                        "status": "done",
                        "service": {"name": "bench", "version": "1"},
                        "result_s3": {"bucket": "mailroom-results", "key": f"r/{job_id}.json"},
                        "result_schema_version": "1.0",
                        "metrics": {"fields_total": 3, "fields_low_confidence": 0},
                    }
                ).encode(),
            )
            for job_id, file_id in rows
        ]
        for start in range(0, len(messages), 1_000):
            results = await client.publish_batch(messages[start : start + 1_000])
            failed = [r for r in results if isinstance(r, Exception)]
            if failed:
                raise SystemExit(f"preloading results failed: {failed[0]}")
    finally:
        await client.close()


class Timing:
    """The worker processes' lines (``inbox_hooks.py``): each batch's enqueue and finish time.

    Times are wall-clock seconds (``time.time()``), the clock of a message's enqueue time.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        #: Where the window starts instead, when set (``--prefill``: the worker's start).
        self.since: float | None = None

    def _lines(self) -> list[tuple[float, float, int, int]]:
        lines = []
        for path in self.folder.glob("*.txt"):
            for line in path.read_text().splitlines():
                enqueued, finished, items, failed = line.split()
                lines.append((float(enqueued), float(finished), int(items), int(failed)))
        return lines

    def ready(self) -> int:
        """Worker processes whose consumers run."""
        return len(list(self.folder.glob("*.ready")))

    def first_ready(self) -> float:
        """When the first worker process's consumers ran (wall clock)."""
        return min(path.stat().st_mtime for path in self.folder.glob("*.ready"))

    @property
    def done(self) -> int:
        return sum(items for _, _, items, _ in self._lines())

    def batches(self) -> int:
        return len(self._lines())

    def failed(self) -> int:
        """Batch messages whose actor raised (Dramatiq retries them)."""
        return sum(failed for _, _, _, failed in self._lines())

    def rate(self) -> float:
        """Every item, per second from the first message's enqueue to the last one finished."""
        lines = self._lines()
        if not lines:
            return 0.0
        return sum(items for _, _, items, _ in lines) / self.seconds()

    def seconds(self) -> float:
        """The measured window: first enqueue (or ``since``) to the last message finished."""
        lines = self._lines()
        start = self.since or min(enqueued for enqueued, _, _, _ in lines)
        return max(finished for _, finished, _, _ in lines) - start


def worker_command() -> list[str]:
    """The inbox's worker as ``mailroom worker -Q inbox`` runs it, with the bench's hooks.

    Dramatiq's CLI in ``mailroom.process.dramatiq_main`` (what ``mailroom worker`` calls), with the
    processes and threads ``mailroom dev`` and the compose stack give the inbox queue;
    ``inbox_hooks`` is imported after ``actors`` in every worker process.
    """
    argv = [
        "actors",
        "inbox_hooks",
        "--path",
        ".",
        "bench",
        "-p",
        WORKER_PROCESSES,
        "-t",
        WORKER_THREADS,
        "--queues",
        "inbox",
    ]
    code = f"import sys; from mailroom import dramatiq_main; sys.exit(dramatiq_main.main({argv!r}))"
    return [sys.executable, "-c", code]


def running(worker: subprocess.Popen[bytes], folder: Path) -> bool:
    """True while the worker runs; its log's end, and the bench's, when it has stopped."""
    if worker.poll() is None:
        return True
    tail = "\n".join((folder / "worker.log").read_text(errors="replace").splitlines()[-20:])
    raise SystemExit(f"inbox worker exited with {worker.returncode}:\n{tail}")


def start_bridge(env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``mailroom bridge nats``, reading the results through ``env``'s durable consumer."""
    code = (
        "import sys; from mailroom.cli import app; sys.argv = ['mailroom', 'bridge', 'nats']; app()"
    )
    return spawn(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def run_inbox(
    broker: Any,
    count: int,
    env: dict[str, str],
    dsn: str,
    pgdata: Path,
    *,
    prefill: bool,
    noop: bool = False,
    durable: str = "bench-inbox",
) -> tuple[float, int]:
    """Results per second through bridge → actor; ``noop`` skips the actor (the baseline).

    Each run reads the preloaded results through its own durable consumer. Prints the CPU
    per result of the bridge, the worker processes and Postgres: on two cores the three
    share, their sum bounds the rate.
    """
    folder = throwaway_folder("inbox-timing-")
    timing = Timing(folder)
    env = {
        **env,
        "MAILROOM_NATS__INBOX_DURABLE": durable,
        "BENCH_INBOX_TIMING_DIR": str(folder),
        "BENCH_INBOX_NOOP": "1" if noop else "0",
    }
    worker: subprocess.Popen[bytes] | None = None
    bridge: subprocess.Popen[bytes] | None = None
    postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
    try:
        if prefill:  # measure the actor alone: the bridge fills the queue before the workers start
            bridge = start_bridge(env)
            t0 = time.perf_counter()
            wait_for(lambda: queued_results(broker) >= count, "bridge prefill", poll_s=0.2)
            print(f"bridge enqueued {count} in {time.perf_counter() - t0:.2f}s (incl. startup)")
        with (folder / "worker.log").open("wb") as log:
            worker = spawn(worker_command(), cwd=ROOT, env=env, stdout=log, stderr=log)
        # Otherwise the bridge starts once the workers consume: neither side counts their start.
        wait_for(
            lambda: running(worker, folder) and timing.ready() >= int(WORKER_PROCESSES),
            "inbox workers",
            poll_s=0.05,
        )
        cpu = ProcessCpu({"postgres": postmaster, "worker": worker.pid})
        if bridge is None:
            bridge = start_bridge(env)
        else:
            timing.since = timing.first_ready()
        wait_for(
            lambda: running(worker, folder) and timing.done >= count,
            "inbox results applied",
            poll_s=0.05,
        )
        bridge_s = ProcessCpu({"bridge": bridge.pid}).base["bridge"]  # since its start
        used = cpu.since_start()
        worker_s, postgres_s = used["worker"], used["postgres"]
        print(
            f"  CPU per result: bridge {bridge_s / count * 1e6:.0f} us (with its start), "
            f"worker {worker_s / count * 1e6:.0f} us, Postgres {postgres_s / count * 1e6:.0f} us"
        )
    finally:
        for process in (bridge, worker):
            if process is not None:
                process.send_signal(signal.SIGTERM)
                process.wait(30)
    with psycopg.connect(dsn) as conn:
        applied = conn.execute(
            "SELECT count(*) FROM recognition_job WHERE status = 'done'"
        ).fetchone()
    batches = timing.batches()
    failed = timing.failed()
    print(
        f"inbox{' baseline' if noop else ''}: {timing.done} results in {batches} actor messages "
        f"({timing.done / batches:.0f} per message) in {timing.seconds():.2f}s"
        + (f", {failed} of them failed once" if failed else "")
    )
    rate = timing.rate()
    remove_folder(folder)
    return rate, int(applied[0]) if applied else 0


def snapshot_answers(dsn: str) -> None:
    """Keep the jobs' and files' state before the inbox's first run (``restore_answers``)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE bench_jobs AS SELECT {', '.join(WRITTEN)} FROM recognition_job")
        conn.execute(
            "CREATE TABLE bench_files AS SELECT id, status, status_reason FROM stored_file"
        )


def restore_answers(dsn: str) -> None:
    """The jobs and files as before the inbox's first run, its result objects gone."""
    columns = [name for name in WRITTEN if name != "id"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"UPDATE recognition_job AS j SET ({', '.join(columns)}) = "
            f"({', '.join('b.' + name for name in columns)}) FROM bench_jobs AS b WHERE j.id = b.id"
        )
        conn.execute(
            "UPDATE stored_file AS f SET status = b.status, status_reason = b.status_reason "
            "FROM bench_files AS b WHERE f.id = b.id"
        )
        conn.execute("DELETE FROM stored_object WHERE bucket_role = 'results'")
        conn.execute("VACUUM ANALYZE recognition_job, stored_file, stored_object")


def queued_results(broker: Any) -> int:
    """Results waiting in the inbox queue, over all its (batch) messages."""
    return sum(
        len(json.loads(raw)["args"][0]) for raw in broker.client.hvals("dramatiq:inbox.msgs")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a shorter relay run (the inbox keeps its results)"
    )
    parser.add_argument("--jobs", type=int, default=MIN_JOBS)
    parser.add_argument("--results", type=int, default=0, help="inbox results (default 10000)")
    parser.add_argument(
        "--prefill", action="store_true", help="inbox: let the bridge enqueue everything first"
    )
    durability.add_flags(parser)
    args = parser.parse_args()
    results = args.results or 10_000
    # Each result answers a published job: never fewer jobs than results.
    jobs = max(args.jobs, MIN_JOBS, results)
    relay_seconds = 4.0 if args.quick else 15.0

    with durability.temporary_state(args, "mailroom-bench-outbox-") as state:
        postgres = EmbeddedPostgres(state / "postgres", fast=args.fast, database="bench").start()
        nats_server = EmbeddedNats(state / "nats").start()
        redis_server = EmbeddedRedis(state / "redis").start()
        try:
            upgrade(postgres.url())
            dsn = postgres.dsn()
            env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
            env.update(
                {
                    "MAILROOM_STATE_DIR": str(state),
                    "MAILROOM_DATABASE__URL": postgres.url(),
                    "MAILROOM_REDIS__URL": redis_server.url,
                    "MAILROOM_BROKER__KIND": "redis",
                    "MAILROOM_NATS__URL": nats_server.url,
                    "MAILROOM_NATS__ALLOW_ANONYMOUS": "true",
                    "MAILROOM_NATS__JETSTREAM": "false",
                    "MAILROOM_NATS__STREAM_NAME": "BENCH",
                    "MAILROOM_NATS__INBOX_DURABLE": "bench-inbox",
                }
            )
            os.environ.update(env)
            from mailroom.settings import Settings

            settings = Settings()
            t0 = time.perf_counter()
            insert_jobs(dsn, jobs)
            print(f"inserted {jobs} queued jobs in {time.perf_counter() - t0:.1f}s")

            relayed, relay_s = asyncio.run(baselines.relay(settings, 1, relay_seconds, acked=False))
            relay_rate = relayed / relay_s
            print(
                f"relay: {relayed} jobs in {relay_s:.2f}s = {relay_rate:.0f} jobs/s "
                "(one per transaction, not acked)"
            )
            # One pass takes at most a window of queued jobs of a pipeline: the loop takes as many.
            full_batch = settings.recognition.publish_batch_size
            batch = min(full_batch, settings.recognition.max_unacked_per_pipeline)
            # The loop runs just before and just after the publisher and the ratio takes their
            # mean, so a change of load between the runs weighs on both sides.
            batched_rates = [batched_loop(settings, dsn, batch, "before the publisher")]
            reset_jobs(dsn)
            published, ours_s = asyncio.run(mailroom_publisher(settings))
            ours_rate = published / ours_s
            print(
                f"mailroom publisher: {published} jobs in {ours_s:.2f}s = {ours_rate:.0f} jobs/s "
                f"(batch {settings.recognition.publish_batch_size}, window "
                f"{settings.recognition.max_unacked_per_pipeline}, each pass acked)"
            )
            if published != jobs:
                raise SystemExit(f"publisher published {published} of {jobs}")
            batched_rates.append(batched_loop(settings, dsn, batch, "after the publisher"))
            if full_batch != batch:
                batched_loop(settings, dsn, full_batch, "at the full publish batch")
            batched_rate = sum(batched_rates) / len(batched_rates)
            # The inbox's results answer published jobs: publish them again, the Mailroom way.
            reset_jobs(dsn)
            asyncio.run(mailroom_publisher(settings))
            unack_jobs(dsn)

            # Inbox: results go through JetStream so they can be pre-loaded before the bridge starts.
            env["MAILROOM_NATS__JETSTREAM"] = "true"
            os.environ.update(env)
            settings = Settings()
            asyncio.run(preload_results(settings, dsn, results))
            import dramatiq

            import actors  # noqa: F401  (builds the RedisBroker from the environment above)

            broker = dramatiq.get_broker()
            # The inbox runs twice and the baseline before, between and after (each run reads
            # every result again, a consumer of its own): the means bracket the load both ran
            # under, and the host's speed, which moves from one run to the next, weighs less.
            noop_rates: list[float] = []
            inbox_rates: list[float] = []
            snapshot_answers(dsn)
            for run in range(5):
                noop = run % 2 == 0
                if not noop and inbox_rates:
                    restore_answers(dsn)  # the jobs wait for their results again
                rate, applied = run_inbox(
                    broker,
                    results,
                    env,
                    dsn,
                    postgres.pgdata,
                    prefill=args.prefill,
                    noop=noop,
                    durable=f"bench-{'noop' if noop else 'inbox'}-{run}",
                )
                if noop:
                    noop_rates.append(rate)
                    print(f"inbox baseline (bridge -> no-op handler): {rate:.0f} results/s")
                    continue
                inbox_rates.append(rate)
                print(
                    f"inbox (bridge -> actor -> Postgres): {rate:.0f} results/s, "
                    f"{applied} of {results} applied"
                )
                if applied != results:
                    raise SystemExit(f"inbox applied {applied} of {results} results")
            noop_rate = sum(noop_rates) / len(noop_rates)
            inbox_rate = sum(inbox_rates) / len(inbox_rates)
            print(f"RESULT outbox ratio={ours_rate / relay_rate:.2f} target=10")
            print(
                f"batched loop, mean of before and after: {batched_rate:.0f} jobs/s; "
                f"publisher {ours_rate:.0f} jobs/s"
            )
            print(f"RESULT outbox_batched ratio={ours_rate / batched_rate:.2f} target=0.8")
            print(
                f"inbox baseline, mean of its 3 runs: {noop_rate:.0f} results/s; "
                f"inbox, mean of its 2: {inbox_rate:.0f} results/s"
            )
            print(f"RESULT inbox ratio={inbox_rate / noop_rate:.2f} target=0.5")
        finally:
            redis_server.stop()
            nats_server.stop()
            postgres.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
