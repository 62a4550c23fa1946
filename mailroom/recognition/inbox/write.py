"""The inbox's transactions on one psycopg connection, each step's statements in one pipeline.

A batch takes two round trips (ARCHITECTURE.md, Recognition, Inbox): hold its jobs,
record its attempt (committed), ``BEGIN`` and lock the job rows; register the result
objects, write back, end the attempt, ``COMMIT`` and let go of the jobs. Through the
ORM each of those statements was a round trip of its own, on three connections.

The hold is session-level advisory locks on this connection (``attempts.HELD_SPACE``,
each job id hashed): they outlive the attempt's own commit, and go
when the batch lets go of them or, if it dies, with its connection. A connection that
may still hold them never goes back to the pool: the caller's ``psycopg_autocommit``
closes it on any exception, and ``release`` closes it when the unlock fails.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from mailroom.db.engine import GENERIC_PLANS
from mailroom.db.params import int_array, uuid_array
from mailroom.recognition import attempts
from mailroom.recognition.inbox import sql as inbox_sql
from mailroom.recognition.inbox.attempts import BEGIN_BATCH, END_BATCH, SETTLE_DEAD_BATCHES
from mailroom.recognition.inbox.revive import REOPEN_MAILS
from mailroom.recognition.inbox.rules import Job

logger = logging.getLogger("mailroom.recognition.inbox.apply")

Connection = psycopg.AsyncConnection[Any]

_BEGIN_BATCH = inbox_sql.psycopg_sql(BEGIN_BATCH)
_END_BATCH = inbox_sql.psycopg_sql(END_BATCH)
_SETTLE_DEAD_BATCHES = [inbox_sql.psycopg_sql(statement) for statement in SETTLE_DEAD_BATCHES]
_REOPEN_MAILS = inbox_sql.psycopg_sql(REOPEN_MAILS)
# The inbox's transactions start with ``GENERIC_PLANS``: at the default (auto), Postgres
# planned the write-back anew for nearly every batch (1.2 ms of CPU, ~12 us a result, against
# 0.07 generic) and the lock, hold and attempt too. Their plans do not depend on the values:
# each finds its rows by primary key through its ``= ANY`` array (the same buffers either way
# in pg_stat_statements).
#: How long a batch waits for another live batch holding one of its jobs.
_HOLD_TIMEOUT = f"{int(attempts.ALONE_WAIT_S * 1000)}ms"


async def hold_and_lock(pg: Connection, ids: str, attempt_id: uuid.UUID) -> tuple[bool, list[Job]]:
    """Hold the jobs, record the attempt, ``BEGIN`` and lock the rows: one round trip.

    True first when another batch's recorded attempt names one of the jobs: as this
    one holds them, that batch died. ``ids``: the jobs' ``uuid[]`` literal.
    """
    async with pg.pipeline():
        # Statements up to a pipeline's sync share one implicit transaction, which a later
        # BEGIN would take over: the attempt gets a transaction of its own, committed first.
        await pg.execute("BEGIN")
        await pg.execute(GENERIC_PLANS)
        hold = {"space": attempts.HELD_SPACE, "ids": ids, "timeout": _HOLD_TIMEOUT}
        await pg.execute(inbox_sql.HOLD, hold, prepare=True)
        # Its own statement after the hold: its snapshot is taken once the locks are granted.
        dead = await pg.execute(_BEGIN_BATCH, {"id": attempt_id, "ids": ids}, prepare=True)
        await pg.execute("COMMIT")
        await pg.execute("BEGIN")
        await pg.execute(GENERIC_PLANS)
        locked = await pg.execute(inbox_sql.LOCK_JOBS, {"ids": ids}, prepare=True)
    return await dead.fetchone() is not None, await _jobs(locked)


async def lock(pg: Connection, ids: str) -> list[Job]:
    """``BEGIN`` and lock the rows (a message applied alone): one round trip."""
    async with pg.pipeline():
        await pg.execute("BEGIN")
        await pg.execute(GENERIC_PLANS)
        locked = await pg.execute(inbox_sql.LOCK_JOBS, {"ids": ids}, prepare=True)
    return await _jobs(locked)


async def _jobs(locked: psycopg.AsyncCursor[Any]) -> list[Job]:
    names = [column.name for column in locked.description or ()]
    return list(map(Job, inbox_sql.locked_rows(names, await locked.fetchall())))


async def write_back(
    pg: Connection,
    jobs: Sequence[Job],
    now: datetime | None,
    *,
    attempt_id: uuid.UUID | None = None,
    release: bool = False,
    ids: str | None = None,
    unkept: Sequence[tuple[str, str]] = (),
) -> None:
    """Write the changed jobs and files back, end the attempt, ``COMMIT`` (and let go).

    ``ids``: the ``uuid[]`` literal the jobs were locked by, if at hand (the write-back
    joins its rows on the ids of the changed jobs, so a superset serves as well).
    ``unkept``: result documents of answers not kept, queued for deletion (``DISCARD``).
    """
    changed = [job for job in jobs if job.changed]
    params = _write_back_params(changed, now, attempt_id, ids) if changed else None
    objects = _objects(changed)
    revived = [job for job in changed if job.revived]
    async with pg.pipeline():
        if params is not None:
            if objects is not None:
                await pg.execute(inbox_sql.REGISTER, {"rows": objects}, prepare=True)
            await pg.execute(inbox_sql.WRITE_BACK, params, prepare=True)
            if revived:  # rare: their files moved on from a NO_ACK error, their mails reopen
                reopen = {
                    "job_ids": [job.id for job in revived],
                    "file_ids": [job.row["file_id"] for job in revived],
                }
                await pg.execute(_REOPEN_MAILS, reopen)
        elif attempt_id is not None:
            await pg.execute(_END_BATCH, {"id": attempt_id}, prepare=True)
        if unkept:
            rows = inbox_sql.to_json([{"bucket": b, "key": k} for b, k in unkept])
            await pg.execute(inbox_sql.DISCARD, {"rows": rows})
        await pg.execute("COMMIT")
        if release:
            await pg.execute(inbox_sql.RELEASE)


def _write_back_params(
    changed: Sequence[Job], now: datetime | None, attempt_id: uuid.UUID | None, ids: str | None
) -> dict[str, Any]:
    job_rows = [_job_row(job) for job in changed]
    file_rows = [
        {
            "job_id": job.id,
            "file_id": job.row["file_id"],
            "error": job.file_change == "error",
            "revived": job.revived,
            # A revived file's NO_ACK reason goes; an error result brings its own.
            "reason": job.file_reason,
        }
        for job in changed
        if job.file_change is not None
    ]
    return {
        "jobs": inbox_sql.to_json(job_rows),
        "job_ids": ids if ids is not None else uuid_array(job.id for job in changed),
        "files": inbox_sql.to_json(file_rows),
        "file_ids": int_array(row["file_id"] for row in file_rows),
        "now": now,
        "attempt": attempt_id,
    }


def _job_row(job: Job) -> dict[str, Any]:
    """The job's written columns; its metrics only when changed (the statement keeps the
    row's otherwise), its result object's bucket and key for the statement to look up."""
    row = job.row
    written = {name: row[name] for name in inbox_sql.WRITTEN}
    if not job.metrics_changed:
        written["metrics"] = None
    written["metrics_changed"] = job.metrics_changed
    bucket, key = job.result_object or (None, None)
    written["result_bucket"] = bucket
    written["result_key"] = key
    return written


def _objects(jobs: Sequence[Job]) -> str | None:
    """The result objects to register once each (one already there is reused), sorted."""
    wanted = {job.result_object: job.created_by for job in jobs if job.result_object}
    if not wanted:
        return None
    return inbox_sql.to_json(
        [{"bucket": b, "key": k, "created_by": by} for (b, k), by in sorted(wanted.items())]
    )


async def roll_back(pg: Connection, *, attempt_id: uuid.UUID | None = None) -> None:
    """End the open transaction, if any (and the attempt, committed apart): the hold stays."""
    in_transaction = pg.info.transaction_status != TransactionStatus.IDLE
    async with pg.pipeline():
        if in_transaction:
            await pg.execute("ROLLBACK")
        if attempt_id is not None:
            await pg.execute(_END_BATCH, {"id": attempt_id}, prepare=True)


async def settle_dead_batches(pg: Connection, ids: str) -> None:
    """The dead batches' rows let go of the held jobs ``ids``: one transaction, one round trip.

    Best effort: the messages are applied, and rows left as they were only send the jobs'
    next batch one by one.
    """
    try:
        async with pg.pipeline():
            await pg.execute("BEGIN")
            for statement in _SETTLE_DEAD_BATCHES:
                await pg.execute(statement, {"ids": ids}, prepare=True)
            await pg.execute("COMMIT")
    except psycopg.Error as exc:
        logger.warning("Could not settle dead inbox batches: %s", type(exc).__name__)
        with contextlib.suppress(psycopg.Error):  # a broken connection is closed by release()
            await pg.rollback()


async def release(pg: Connection) -> None:
    """Let go of the jobs; a connection that cannot say so is closed, and they go with it."""
    try:
        await pg.execute(inbox_sql.RELEASE)
    except Exception:
        logger.warning("Could not release an inbox batch's jobs; closing its connection")
        await pg.close()
