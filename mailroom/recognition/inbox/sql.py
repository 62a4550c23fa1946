"""The inbox's SQL: lock a batch's jobs, register result objects, write the batch back.

Beside ``inbox.py``, which applies each message's rules in Python between the
lock and the write-back (ARCHITECTURE.md, Recognition, Inbox). The statements run on a
psycopg connection in pipelines (``inbox_write.py``), so they are psycopg's SQL strings.
"""

from __future__ import annotations

from typing import Any

import pydantic_core
from sqlalchemy import TextClause, text
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect

_DIALECT = psycopg_dialect.dialect()  # type: ignore[no-untyped-call]


def psycopg_sql(statement: TextClause) -> str:
    """A ``text()`` statement as psycopg's SQL (``:name`` becomes ``%(name)s``)."""
    return str(statement.compile(dialect=_DIALECT))


# The columns an answer may change; the batch reads them under the lock and writes them back.
# Each row carries the transaction's time (``now()``), so the batch needs no round trip for it.
# ``metrics`` comes as text, for ``locked_rows`` to read with pydantic's parser.
LOCK_JOBS = psycopg_sql(
    text(
        """
    SELECT now() AS db_now, id, file_id, status, attempt, result_msg_id,
           CAST(metrics AS text) AS metrics, started_at, finished_at,
           service_name, service_version, fields_total, fields_low_confidence,
           fields_unrecognized, error_code, error_message, result_schema_version,
           result_object_id, reply_deadline
      FROM recognition_job
     WHERE id = ANY(CAST(:ids AS uuid[]))
     ORDER BY id
       FOR UPDATE
    """
    )
)

# The jobs held for a live batch (attempts.HELD_SPACE, each job id's text hashed), as
# session locks: they outlive the batch's attempt, committed on its own. In hash order, so two
# batches of shared jobs wait for each other, never deadlock; the lock timeout is set first.
HOLD = psycopg_sql(
    text(
        """
    SELECT count(pg_advisory_lock(:space, h))
      FROM (SELECT DISTINCT hashtext(x) AS h FROM unnest(CAST(:ids AS text[])) AS x ORDER BY h) AS held
     WHERE (SELECT set_config('lock_timeout', :timeout, true)) IS NOT NULL
    """
    )
)
RELEASE = "SELECT pg_advisory_unlock_all()"

# Sorted, so two batches registering the same keys wait for each other instead of deadlocking.
# In the write-back's pipeline, without RETURNING: the write-back, a later statement with a
# fresh snapshot, finds each object, also one another transaction committed while this waited.
REGISTER = psycopg_sql(
    text(
        """
    INSERT INTO stored_object (bucket_role, bucket, key, created_by)
    SELECT 'results', r.bucket, r.key, r.created_by
      FROM json_to_recordset(CAST(:rows AS json)) AS r(bucket text, key text, created_by text)
     ORDER BY r.bucket, r.key
    ON CONFLICT (bucket, key) DO NOTHING
    """
    )
)

# Result documents named by answers the batch did not keep: queued for deletion unless an
# object row registers them (``lifecycle.objects``: the retention pass deletes them after its
# grace, and keeps one registered meanwhile). After the write-back, so a key the same batch
# registered is kept.
DISCARD = psycopg_sql(
    text(
        """
    INSERT INTO object_deletion (bucket, key)
    SELECT DISTINCT r.bucket, r.key
      FROM json_to_recordset(CAST(:rows AS json)) AS r(bucket text, key text)
     WHERE NOT EXISTS (SELECT 1 FROM stored_object AS o WHERE o.bucket = r.bucket AND o.key = r.key)
     ORDER BY r.bucket, r.key
    ON CONFLICT (bucket, key) DO UPDATE SET requested_at = now()
    """
    )
)

# The rows come as ``json``, not ``jsonb``: read once, they need no ``jsonb`` built first
# (100 job rows: 0.75-0.83 ms against 1.02-1.06 in a loop of ``*_to_recordset`` alone).
# The jobs and their current files in one statement (Postgres runs a data-modifying WITH
# whether or not the main statement reads it). The ``= ANY`` arrays steer the planner to the
# primary keys: it cannot size ``json_to_recordset`` and would scan both tables. A file follows
# only its current job and leaves UPLOADED only forward; an error result fails it; a revived
# job's answer replaces the NO_ACK ERROR (revive.py). The batch's recorded attempt ends with it
# (``:attempt``, NULL for a message applied alone: inbox_attempts.py).
WRITE_BACK = psycopg_sql(
    text(
        """
    WITH ended AS (
        DELETE FROM inbox_batch_attempt WHERE id = CAST(:attempt AS uuid)
    ),
    jobs AS (
        UPDATE recognition_job AS j
           SET status = r.status, started_at = r.started_at, finished_at = r.finished_at,
               service_name = r.service_name, service_version = r.service_version,
               metrics = CASE WHEN r.metrics_changed THEN r.metrics ELSE j.metrics END,
               fields_total = r.fields_total,
               fields_low_confidence = r.fields_low_confidence,
               fields_unrecognized = r.fields_unrecognized,
               error_code = r.error_code, error_message = r.error_message,
               result_schema_version = r.result_schema_version,
               -- A result's object, registered by the statement before; else the row's.
               result_object_id = CASE WHEN r.result_key IS NULL THEN r.result_object_id
                   ELSE (SELECT o.id FROM stored_object AS o
                          WHERE o.bucket = r.result_bucket AND o.key = r.result_key) END,
               result_msg_id = r.result_msg_id
          FROM json_to_recordset(CAST(:jobs AS json)) AS r(
               id uuid, status text, started_at timestamptz, finished_at timestamptz,
               service_name text, service_version text, metrics_changed boolean, metrics jsonb,
               fields_total int, fields_low_confidence int, fields_unrecognized int,
               error_code text, error_message text, result_schema_version text,
               result_object_id bigint, result_msg_id text, result_bucket text, result_key text)
         WHERE j.id = r.id AND j.id = ANY(CAST(:job_ids AS uuid[]))
        RETURNING j.id
    )
    UPDATE stored_file AS f
       SET status = CASE WHEN r.error THEN 'ERROR' ELSE 'PROCESSING' END,
           status_reason = CASE WHEN r.error OR r.revived THEN r.reason ELSE f.status_reason END,
           updated_at = COALESCE(CAST(:now AS timestamptz), now())
      FROM json_to_recordset(CAST(:files AS json))
           AS r(job_id uuid, file_id bigint, error boolean, revived boolean, reason text)
     WHERE f.id = r.file_id AND f.id = ANY(CAST(:file_ids AS bigint[]))
       AND f.current_recognition_job_id = r.job_id
       AND (r.error OR f.status = 'UPLOADED' OR (r.revived AND f.status = 'ERROR'))
    """
    )
)

#: The job columns the write-back sets (``metrics`` only when ``metrics_changed``).
WRITTEN = (
    "id",
    "status",
    "started_at",
    "finished_at",
    "service_name",
    "service_version",
    "metrics",
    "fields_total",
    "fields_low_confidence",
    "fields_unrecognized",
    "error_code",
    "error_message",
    "result_schema_version",
    "result_object_id",
    "result_msg_id",
)


def locked_rows(names: list[str], result: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """``LOCK_JOBS``'s rows as dicts, ``metrics`` parsed (a few times faster than psycopg's
    ``json.loads``)."""
    rows = [dict(zip(names, row, strict=True)) for row in result]
    for row in rows:
        if row["metrics"] is not None:
            row["metrics"] = pydantic_core.from_json(row["metrics"])
    return rows


def to_json(value: Any) -> str:
    """Compact JSON for the ``json_to_recordset`` parameters; datetimes as ISO text.

    pydantic's serializer: several times faster than ``json.dumps`` with a ``default``
    hook on a batch's rows (datetimes, uuids), with the same output for Postgres.
    """
    return pydantic_core.to_json(value).decode()
