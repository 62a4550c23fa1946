"""Fairer baselines for ``bench/outbox.py``: the same work without Mailroom's protocol.

* ``relay``: claim up to a batch of queued jobs, oldest first, with ``SKIP LOCKED``
  (the publisher's order and index), publish each on core NATS with one flush for
  the batch, mark them published in one statement, commit: what the outbox publisher
  does, without building and checking requests, deadlines, republish rules, metrics
  or flow control. A batch of one, time-boxed, is the one-job-per-transaction relay.
  Like the publisher's run, one pipeline's jobs (the index the publisher claims along).
* ``ack``: what a prompt recognition service does to what it was sent (published ->
  processing, one statement a batch). With flow control a window full of unacked
  requests stops the publisher, so its run and the batched loop's are acked alike. The
  time-boxed one-job relay stays far below a window and is not acked (an ack a job would
  double its transactions and flatter the publisher).
* ``Skipping``: a Dramatiq middleware that acks the inbox's batch messages without
  running the actor, so the bridge → Redis → worker path is timed with a no-op
  handler, per result, like the real inbox.
"""

from __future__ import annotations

import time
from typing import Any

_CLAIM = """
    SELECT j.id, j.attempt, f.original_name, o.key
      FROM recognition_job AS j
      JOIN stored_file AS f ON f.id = j.file_id
      LEFT JOIN stored_object AS o ON o.id = f.object_id
     WHERE j.status = 'queued' AND j.pipeline = 'tabular'
     ORDER BY j.requested_at, j.id
     LIMIT :limit
       FOR UPDATE OF j SKIP LOCKED
"""
_MARK = """
    UPDATE recognition_job SET status = 'published', published_at = now(),
           request_msg_id = u.msg_id, request_subject = :subject
      FROM unnest(CAST(:ids AS uuid[]), CAST(:msg_ids AS text[])) AS u(id, msg_id)
     WHERE recognition_job.id = u.id
"""
_ACK = """
    UPDATE recognition_job SET status = 'processing', started_at = now()
     WHERE id = ANY(CAST(:ids AS uuid[])) AND status = 'published'
"""


async def ack(sessions: Any, ids: list[Any]) -> None:
    """Ack these published jobs as a service would, in a transaction of their own."""
    from sqlalchemy import text

    from mailroom.db.params import uuid_array

    if ids:
        async with sessions() as session, session.begin():
            await session.execute(text(_ACK), {"ids": uuid_array(ids)})


async def relay(
    settings: Any, batch: int, seconds: float | None = None, *, acked: bool = True
) -> tuple[int, float]:
    """Claim-and-publish in batches until nothing is queued or ``seconds`` ran, each batch
    acked after its commit when ``acked`` (``ack``); (jobs, elapsed)."""
    import json

    import nats as nats_py
    from sqlalchemy import text

    from mailroom.db.engine import create_engine, create_sessionmaker

    engine = create_engine(settings.database)
    sessions = create_sessionmaker(engine)
    nc = await nats_py.connect(servers=settings.nats.server_urls)
    subject = settings.nats.subject(settings.nats.tabular_subject)
    done = 0
    started = time.perf_counter()
    try:
        while seconds is None or time.perf_counter() - started < seconds:
            async with sessions() as session, session.begin():
                rows = (await session.execute(text(_CLAIM), {"limit": batch})).all()
                if not rows:
                    break
                msg_ids = [f"{row.id}:{row.attempt}:request" for row in rows]
                for row, msg_id in zip(rows, msg_ids, strict=True):
                    body = {"job_id": str(row.id), "name": row.original_name, "key": row.key}
                    await nc.publish(
                        subject, json.dumps(body).encode(), headers={"Nats-Msg-Id": msg_id}
                    )
                await nc.flush()
                await session.execute(
                    text(_MARK),
                    {"ids": [row.id for row in rows], "msg_ids": msg_ids, "subject": subject},
                )
            if acked:
                await ack(sessions, [row.id for row in rows])
            done += len(rows)
        return done, time.perf_counter() - started
    finally:
        await nc.close()
        await engine.dispose()


def skipping(actor_name: str) -> Any:
    """Middleware that acks ``actor_name``'s messages without running it (a no-op handler)."""
    import dramatiq
    from dramatiq.middleware import SkipMessage

    class _Skipping(dramatiq.Middleware):
        def before_process_message(self, broker, message):  # type: ignore[no-untyped-def]
            if message.actor_name == actor_name:
                raise SkipMessage()

    return _Skipping()
