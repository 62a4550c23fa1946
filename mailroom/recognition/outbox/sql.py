"""The outbox's SQL: claim a pass's jobs within each pipeline's window, probe, record.

Beside ``outbox.py``, which builds, publishes and records the requests
(ARCHITECTURE.md, Recognition, Outbox and Flow control).
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Result, text

from mailroom.recognition.finality import object_metrics_sql, republish_count_sql

_COUNT = republish_count_sql("j.metrics")
# The caller's time (tests move it), else the database's: no round trip for it.
_NOW = "COALESCE(CAST(:now AS timestamptz), now())"

# Candidates: the queued jobs of each pipeline up to the free places of its window, oldest
# first along ix_recognition_job_queued, and published jobs with no ack for ack_timeout times
# (republishes + 1), while the reply deadline has not passed (the watchdog owns those) and the
# health gate of the pipeline is open (gate.py). The no-ack window runs from ``republish_from``
# once a reopened gate refreshed the job, else from the first publish. The published jobs are
# few (a window's worth per pipeline, read and counted along partial indexes of them). The
# jobs are claimed first, oldest first, and joined to their files after: sorting the join of
# every candidate (locking carries whole rows) cost a pass more than the rest of it. Every
# pipeline brings one row even with nothing claimed (its ``free`` places; ``id`` NULL).
# Queued jobs are taken only of the file types declared for their pipeline (``types``, a
# comma list; NULL: every type; empty: none, and then the queue is not even read): the
# others wait queued (declared.py).
# ``now`` is the caller's time or the transaction's, which every row brings back (``db_now``).
_JOB_COLUMNS = f"""j.id, j.file_id, j.pipeline, j.status, j.attempt, j.reply_deadline,
               j.request_subject, j.requested_at, {_COUNT} AS republish_count"""
CLAIM = text(
    f"""
    WITH slots AS (
        SELECT p.pipeline, string_to_array(p.types, ',') AS types,
               GREATEST(:window - (SELECT count(*) FROM recognition_job AS u
                                    WHERE u.status = 'published' AND u.pipeline = p.pipeline),
                        0) AS free
          FROM unnest(CAST(:pipelines AS text[]), CAST(:types AS text[])) AS p(pipeline, types)
    ),
    waiting AS (
        SELECT {_JOB_COLUMNS}
          FROM recognition_job AS j
         WHERE j.status = 'published'
           AND j.reply_deadline > {_NOW}
           AND j.pipeline <> ALL(CAST(:held AS text[]))
           AND COALESCE(CAST(j.metrics ->> 'republish_from' AS timestamptz), j.published_at)
               <= {_NOW} - make_interval(secs => :ack_timeout_s * ({_COUNT} + 1))
         ORDER BY j.requested_at, j.id
         LIMIT :limit
           FOR UPDATE OF j SKIP LOCKED
    ),
    fresh AS (
        SELECT q.*
          FROM slots AS s
         CROSS JOIN LATERAL (
            SELECT {_JOB_COLUMNS}
              FROM recognition_job AS j
             WHERE j.status = 'queued' AND j.pipeline = s.pipeline
               AND (s.types IS NULL OR EXISTS (
                    SELECT 1 FROM stored_file AS t
                     WHERE t.id = j.file_id AND t.file_type = ANY(s.types)))
             ORDER BY j.requested_at, j.id
             LIMIT CASE WHEN cardinality(s.types) = 0 THEN 0 ELSE LEAST(s.free, :limit) END
               FOR UPDATE OF j SKIP LOCKED
         ) AS q
    ),
    claimed AS (
        SELECT * FROM waiting
        UNION ALL
        SELECT * FROM fresh
         ORDER BY requested_at, id
         LIMIT :limit
    )
    SELECT s.pipeline AS window_pipeline, s.free,
           c.id, c.file_id, c.pipeline, c.status, c.attempt, c.reply_deadline,
           c.request_subject, c.republish_count, now() AS db_now,
           f.original_name, f.file_type, o.bucket, o.key
      FROM slots AS s
      LEFT JOIN claimed AS c ON c.pipeline = s.pipeline
      LEFT JOIN stored_file AS f ON f.id = c.file_id
      LEFT JOIN stored_object AS o ON o.id = f.object_id
     ORDER BY c.requested_at, c.id
    """
)

# While a pipeline's gate is closed its oldest unacked job is sent again each pass, uncounted:
# a service that comes back (or only subscribes to new requests) has something to answer.
PROBE = text(
    """
    SELECT j.id, j.file_id, j.pipeline, j.status, j.attempt, j.reply_deadline,
           j.request_subject, 0 AS republish_count, now() AS db_now,
           f.original_name, f.file_type, o.bucket, o.key
      FROM recognition_job AS j
      JOIN stored_file AS f ON f.id = j.file_id
      LEFT JOIN stored_object AS o ON o.id = f.object_id
     WHERE j.status = 'published' AND j.pipeline = :pipeline
     ORDER BY j.published_at, j.requested_at, j.id
     LIMIT 1
       FOR UPDATE OF j SKIP LOCKED
    """
)

MARK_PUBLISHED = text(
    """
    UPDATE recognition_job AS j
       SET status = 'published', published_at = :now, reply_deadline = :deadline,
           request_msg_id = v.msg_id, request_subject = v.subject
      FROM unnest(CAST(:ids AS uuid[]), CAST(:msg_ids AS text[]), CAST(:subjects AS text[]))
           AS v(id, msg_id, subject)
     WHERE j.id = v.id
    """
)

MARK_REPUBLISHED = text(
    f"""
    UPDATE recognition_job AS j
       SET metrics = {object_metrics_sql("j.metrics")}
                     || jsonb_build_object('republish_count', {_COUNT} + 1)
     WHERE j.id = ANY(CAST(:ids AS uuid[]))
    """
)

MARK_FAILED = text(
    """
    UPDATE recognition_job AS j
       SET status = :status, error_code = :code, error_message = v.message, finished_at = :now
      FROM unnest(CAST(:ids AS uuid[]), CAST(:messages AS text[])) AS v(id, message)
     WHERE j.id = v.id
    """
)


class ClaimedJob(NamedTuple):
    """A job row that CLAIM or PROBE returned, with its file and object columns."""

    id: uuid.UUID
    file_id: int
    pipeline: str
    status: str
    attempt: int
    reply_deadline: datetime | None
    request_subject: str | None
    republish_count: int
    original_name: str | None
    file_type: str | None
    bucket: str | None
    key: str | None


def read_rows(result: Result[Any]) -> tuple[dict[str, int], list[tuple[Any, ...]]]:
    """The result's column positions by name, and its rows as plain tuples.

    A pass reads a dozen columns of each of hundreds of rows, and a SQLAlchemy ``Row``
    looks an attribute up by name for about as long as building the request takes
    (1.5 us against 0.03 us for a tuple's field): the outbox reads columns by position.
    """
    return {name: at for at, name in enumerate(result.keys())}, [tuple(row) for row in result]


def claimed_jobs(columns: dict[str, int], rows: Iterable[tuple[Any, ...]]) -> list[ClaimedJob]:
    """The rows (of ``read_rows``) that carry a job."""
    take = operator.itemgetter(*(columns[name] for name in ClaimedJob._fields))
    at_id = columns["id"]
    return [ClaimedJob._make(take(row)) for row in rows if row[at_id] is not None]
