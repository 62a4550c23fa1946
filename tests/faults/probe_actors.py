"""Actors and hooks for fault tests, loaded by real ``dramatiq`` worker processes.

The probe actor records each start in Redis and then works for a long time, so
a test can kill its worker mid-message and watch another worker pick the
message up.

With ``PROBE_DIE=1`` in its environment, a worker that loads this module also
dies (``os._exit``, as an OOM kill or a segfault in a C library would) on
marked input, so a test can watch the product bound its attempts:

- intake, while parsing a mail whose bytes contain ``die-in-parsing``;
- the inbox, while applying a result for a file named ``die-in-inbox…``;
- mapping, while reading the result of a file named ``die-in-mapping…``.

The hooks wrap product functions from the outside; the product has none.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import dramatiq
import psycopg
import redis

import actors  # noqa: F401  (builds the real broker from MAILROOM_* settings)
from actors.middleware.retry_policy import RetryPolicy
from mailroom.db.engine import libpq_dsn

PROBE_QUEUE = "faults_probe"

#: Markers of the input a ``PROBE_DIE=1`` worker dies on.
DIE_IN_PARSING = "die-in-parsing"
DIE_IN_INBOX = "die-in-inbox"
DIE_IN_MAPPING = "die-in-mapping"


@dramatiq.actor(queue_name=PROBE_QUEUE, retry_policy=RetryPolicy(max_attempts=1))
def record_and_work(key: str, work_s: float) -> None:
    """Append this process' pid to ``key``, then work for ``work_s`` seconds."""
    client = redis.Redis.from_url(os.environ["MAILROOM_REDIS__URL"])
    try:
        client.rpush(key, f"{os.getpid()}:{time.time()}")
    finally:
        client.close()
    time.sleep(work_s)


def _die(what: str) -> None:
    print(f"probe: worker {os.getpid()} dies {what}", flush=True)
    os._exit(1)


def _file_name(sql: str, key: object) -> str:
    dsn = libpq_dsn(os.environ["MAILROOM_DATABASE__URL"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql, (key,)).fetchone()
    return str(row[0]) if row else ""


def _install_hooks() -> None:
    from mailroom.intake import ingest
    from mailroom.recognition.inbox import apply as inbox
    from mailroom.recognition.mapping import run as mapping

    parse_mail = ingest.parse_mail

    def parse_or_die(raw: bytes, *args: Any, **kwargs: Any) -> Any:
        if DIE_IN_PARSING.encode() in raw:
            _die("parsing a mail")
        return parse_mail(raw, *args, **kwargs)

    ingest.parse_mail = parse_or_die  # type: ignore[assignment]

    apply_one = inbox._apply_one

    def apply_or_die(batch: Any, jobs: Any, parsed: Any, now: Any) -> None:
        response = parsed.response
        if not response.is_ack:
            name = _file_name(
                "SELECT original_name FROM stored_file WHERE id = %s", response.file_id
            )
            if name.startswith(DIE_IN_INBOX):
                _die(f"in the inbox on job {response.job_id}")
        apply_one(batch, jobs, parsed, now)

    inbox._apply_one = apply_or_die  # type: ignore[assignment]

    load_result = mapping.load_result

    async def load_or_die(*args: Any, job_id: uuid.UUID, **kwargs: Any) -> Any:
        name = _file_name(
            "SELECT f.original_name FROM recognition_job AS j "
            "JOIN stored_file AS f ON f.id = j.file_id WHERE j.id = %s",
            job_id,
        )
        if name.startswith(DIE_IN_MAPPING):
            _die(f"in mapping on job {job_id}")
        return await load_result(*args, job_id=job_id, **kwargs)

    mapping.load_result = load_or_die  # type: ignore[assignment]


if os.environ.get("PROBE_DIE") == "1":
    _install_hooks()
