"""The one statement that stores a mail: fence, dedupe, objects, mail, files, jobs.

Each mail is one statement; a group of mails is pipelined in one transaction
(intake's throughput is bound by round trips and CPU, and a commit per mail cost
Postgres as much as the statement), or one transaction per mail when the group
fails. The data-modifying CTEs run on one snapshot:

- ``fence`` moves ``last_uid`` only while our lease holds; no row means the
  lease is lost and every insert below is gated off (``go`` is empty);
- ``known`` is the dedupe (same Message-ID, or none, and same raw bytes, in
  this cursor), so a mail re-read after a UIDVALIDITY change is not stored twice,
  and the tombstone check (same bytes or same Message-ID as an erased mail, in any
  cursor: ``intake.tombstones``);
- ``objects`` registers the .eml and the attachments (a no-op DO UPDATE so
  RETURNING yields rows registered before too, like ``register_object``);
- ``mail`` inserts the row, or completes the row of earlier failed attempts,
  and yields nothing when the UID is already stored;
- ``numbered`` draws the files' ids in order, so a file extracted from a forwarded
  mail or winmail.dat can point at its container's row (``parent_file_id``);
- ``files`` and ``jobs`` follow; foreign keys are checked at the statement's end.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

from mailroom.db.engine import GENERIC_PLANS

logger = logging.getLogger(__name__)

_STORE_MAIL = """
WITH fence AS (
    UPDATE mailbox_cursor SET last_uid = CAST(%(uid)s AS bigint), updated_at = now()
    WHERE id = CAST(%(cursor_id)s AS integer) AND lease_id = CAST(%(lease_id)s AS uuid)
    RETURNING id
), known AS (
    SELECT EXISTS (
        SELECT 1 FROM inbound_mail m
        WHERE m.cursor_id = CAST(%(cursor_id)s AS integer)
          AND m.content_sha256 = CAST(%(sha256)s AS text)
          AND {same_message_id}
          AND m.status <> 'failed'
    ) AS duplicate, %(erased)s OR EXISTS (
        SELECT 1 FROM erased_mail e WHERE e.content_sha256 = CAST(%(sha256)s AS text)
        OR e.message_id_sha256 = CAST(%(message_id_sha256)s AS text)
    ) AS erased
), go AS (
    SELECT 1 FROM fence, known WHERE NOT known.duplicate AND NOT known.erased
), objects AS (
    INSERT INTO stored_object (bucket_role, bucket, key, size, sha256, media_type, created_by)
    SELECT o.bucket_role, o.bucket, o.key, o.size, o.sha256, o.media_type,
        CAST(%(created_by)s AS text)
    FROM json_to_recordset(CAST(%(objects)s AS json)) AS o(
        bucket_role text, bucket text, key text, size bigint, sha256 text, media_type text
    ), go
    ON CONFLICT (bucket, key) DO UPDATE SET bucket = EXCLUDED.bucket
    RETURNING id, bucket, key
), mail AS (
    INSERT INTO inbound_mail (
        cursor_id, uidvalidity, uid, message_id, content_sha256, sender, sender_name, return_path,
        authentication_results, subject, internal_date, raw_object_id, status, last_error,
        last_attempt_at
    )
    SELECT CAST(%(cursor_id)s AS integer), CAST(%(uidvalidity)s AS bigint), CAST(%(uid)s AS bigint),
        CAST(%(message_id)s AS text), CAST(%(sha256)s AS text), CAST(%(sender)s AS text),
        CAST(%(sender_name)s AS text),
        CAST(%(return_path)s AS text), CAST(%(authentication_results)s AS text),
        CAST(%(subject)s AS text), CAST(%(internal_date)s AS timestamptz),
        (SELECT id FROM objects
         WHERE bucket = CAST(%(raw_bucket)s AS text) AND key = CAST(%(raw_key)s AS text)),
        'stored', CAST(%(problem)s AS text), now()
    FROM go
    ON CONFLICT (cursor_id, uidvalidity, uid) DO UPDATE SET
        message_id = EXCLUDED.message_id,
        content_sha256 = EXCLUDED.content_sha256,
        sender = EXCLUDED.sender,
        sender_name = EXCLUDED.sender_name,
        return_path = EXCLUDED.return_path,
        authentication_results = EXCLUDED.authentication_results,
        subject = EXCLUDED.subject,
        internal_date = EXCLUDED.internal_date,
        raw_object_id = EXCLUDED.raw_object_id,
        status = 'stored',
        last_error = EXCLUDED.last_error,
        last_attempt_at = EXCLUDED.last_attempt_at,
        next_retry_at = NULL
    WHERE inbound_mail.status = 'failed'
    RETURNING id
), numbered AS MATERIALIZED (
    -- Ids drawn first, in position order, so a file can name its container's id.
    SELECT nextval(pg_get_serial_sequence('stored_file', 'id')) AS id, f.*
    FROM (
        SELECT mail.id AS mail_id, f.*
        FROM mail
        CROSS JOIN json_to_recordset(CAST(%(files)s AS json)) AS f(
            position integer, bucket text, key text, original_name text, file_type text,
            media_type text, size bigint, status text, status_reason text, job_id uuid,
            parent_position integer, source_path text, type_rule text
        )
        ORDER BY f.position
    ) AS f
), files AS (
    INSERT INTO stored_file (
        id, mail_id, object_id, original_name, file_type, media_type, size, status,
        status_reason, current_recognition_job_id, parent_file_id, source_path, type_rule
    )
    SELECT f.id, f.mail_id, objects.id, f.original_name, f.file_type, f.media_type, f.size,
        f.status, f.status_reason, f.job_id, parent.id, f.source_path, f.type_rule
    FROM numbered AS f
    LEFT JOIN numbered AS parent ON parent.position = f.parent_position
    LEFT JOIN objects ON objects.bucket = f.bucket AND objects.key = f.key
    ORDER BY f.position
    RETURNING id, current_recognition_job_id
), jobs AS (
    INSERT INTO recognition_job (id, file_id, pipeline, status, attempt)
    SELECT files.current_recognition_job_id, files.id, j.pipeline, 'queued', 1
    FROM files
    JOIN json_to_recordset(CAST(%(files)s AS json)) AS j(job_id uuid, pipeline text)
      ON j.job_id = files.current_recognition_job_id
    RETURNING id
)
SELECT
    (SELECT count(*) FROM fence) AS fenced,
    (SELECT duplicate FROM known) AS duplicate,
    (SELECT erased FROM known) AS erased,
    (SELECT id FROM mail) AS mail_id,
    (SELECT count(*) FROM jobs) AS jobs
"""


def _compact(statement: str) -> str:
    """``statement`` without its indentation.

    psycopg caches the parsing of a query's placeholders only for queries up to 4,096
    characters; over that it parses the query again for every mail.
    """
    return "\n".join(line.strip() for line in statement.splitlines() if line.strip())


# Two spellings of the dedupe so both can use the (message_id, content_sha256) index.
STORE_MAIL_WITH_ID = _compact(
    _STORE_MAIL.format(same_message_id="m.message_id = CAST(%(message_id)s AS text)")
)
STORE_MAIL_WITHOUT_ID = _compact(_STORE_MAIL.format(same_message_id="m.message_id IS NULL"))


@dataclass(frozen=True)
class StoreResult:
    fenced: bool
    duplicate: bool
    #: The mail matched an erased mail's tombstone: nothing was inserted.
    erased: bool
    #: None when nothing was inserted (lease lost, duplicate, erased, or the UID was stored
    #: already).
    mail_id: int | None
    jobs: int


@dataclass(frozen=True)
class FileRow:
    #: Order of the attachment in the mail; file ids follow it.
    position: int
    bucket: str | None
    key: str | None
    original_name: str
    file_type: str
    media_type: str
    size: int
    status: str
    status_reason: str | None
    job_id: uuid.UUID | None
    pipeline: str | None
    #: ``position`` of the container the file came out of; None for the mail's own parts.
    parent_position: int | None = None
    #: Where the file sits in the mail: ``forwarded.eml/invoice.csv``.
    source_path: str | None = None
    #: The rule that decided ``file_type``: extension, media_type or content.
    type_rule: str | None = None


def _json(rows: list[dict[str, Any]]) -> str:
    return json.dumps(rows, default=str)


@dataclass(frozen=True)
class MailWrite:
    """Everything the statement stores for one mail."""

    cursor_id: int
    lease_id: uuid.UUID
    uidvalidity: int
    uid: int
    mail: dict[str, Any]
    raw: tuple[str, str] | None
    objects: list[dict[str, Any]]
    files: list[FileRow]
    created_by: str

    def params(self) -> dict[str, Any]:
        return {
            "cursor_id": self.cursor_id,
            "lease_id": self.lease_id,
            "uidvalidity": self.uidvalidity,
            "uid": self.uid,
            **self.mail,
            "raw_bucket": self.raw[0] if self.raw else None,
            "raw_key": self.raw[1] if self.raw else None,
            "objects": _json(self.objects),
            "files": _json([f.__dict__ for f in self.files]),
            "created_by": self.created_by,
        }


async def store_mails(
    pg: psycopg.AsyncConnection[Any], writes: list[MailWrite]
) -> tuple[list[StoreResult], psycopg.Error | None]:
    """Store mails in UID order: the results of the mails committed, and the error that stopped
    the rest, if any.

    ``pg`` is the psycopg connection under the batch's SQLAlchemy connection, in
    autocommit mode: statements run server-side prepared, without SQLAlchemy's
    per-call compile and result wrapping. A group goes in one transaction first (each mail
    still fenced on the lease, so a lost lease stops the group at that mail): a commit per mail
    cost Postgres about as much CPU as the mail's statement. When anything in it fails, the
    group is rolled back and stored again one transaction per mail, so the mails before the one
    that failed are committed.
    """
    if not pg.autocommit:
        raise RuntimeError("store_mails needs an autocommit connection")
    if len(writes) > 1:
        results, error = await _pipelined(pg, writes, together=True)
        if error is None:
            return _checked(results, None, writes)
        # The state only, never the message: Postgres quotes failing rows, mail headers included.
        logger.info(
            "a group of %d mails failed together (%s, SQLSTATE %s); storing them one by one",
            len(writes),
            type(error).__name__,
            error.sqlstate,
        )
    results, error = await _pipelined(pg, writes, together=False)
    return _checked(results, error, writes)


def _statement(write: MailWrite) -> str:
    return STORE_MAIL_WITHOUT_ID if write.mail["message_id"] is None else STORE_MAIL_WITH_ID


async def _pipelined(
    pg: psycopg.AsyncConnection[Any], writes: list[MailWrite], *, together: bool
) -> tuple[list[StoreResult], psycopg.Error | None]:
    """The mails in one pipeline and one Sync: the results of those committed, and the error.

    ``BEGIN``, then each mail's statement, followed by ``COMMIT AND CHAIN`` (a transaction per
    mail) unless ``together``, and a plain ``COMMIT`` after the last. Postgres skips everything
    after the first error, so the mails committed are those before the last ``COMMIT`` that
    went through (together: all or none), and the error is that of the mail after them.
    """
    sent: list[tuple[psycopg.AsyncCursor[Any], psycopg.AsyncCursor[Any] | None]] = []
    error: psycopg.Error | None = None
    try:
        async with pg.pipeline():
            await pg.execute("BEGIN")
            for number, write in enumerate(writes, start=1):
                if number == 1 or not together:  # each transaction takes it anew
                    # Otherwise each connection plans it for its values five times before it
                    # tries the generic plan, and again after each invalidation (statistics
                    # change as the tables grow): 114 plans of ~2.4 ms for 2,000 mails in a
                    # fairness run, against 14.
                    await pg.execute(GENERIC_PLANS)
                store = await pg.cursor().execute(_statement(write), write.params(), prepare=True)
                if number == len(writes):
                    end: str | None = "COMMIT"
                elif together:
                    end = None
                else:  # AND CHAIN opens the next mail's transaction at once: one command less
                    end = "COMMIT AND CHAIN"
                sent.append((store, await pg.execute(end) if end else None))
    except psycopg.Error as exc:
        error = exc
    if error is not None and not pg.closed:
        await pg.rollback()  # the failed transaction block, if it is still open
    committed = max(
        (n for n, (_, end) in enumerate(sent, start=1) if end and end.statusmessage == "COMMIT"),
        default=0,
    )
    return [_result(await store.fetchone()) for store, _ in sent[:committed]], error


def _checked(
    results: list[StoreResult], error: psycopg.Error | None, writes: list[MailWrite]
) -> tuple[list[StoreResult], psycopg.Error | None]:
    if error is None and len(results) < len(writes):
        raise RuntimeError("Postgres acknowledged fewer mails than were sent")
    if error is not None and len(results) == len(writes):
        raise error  # every mail committed: the failure is not one of theirs
    return results, error


def _result(row: Any) -> StoreResult:
    if row is None:
        raise RuntimeError("store_mail returned no row")
    fenced, duplicate, erased, mail_id, jobs = row
    return StoreResult(
        fenced=bool(fenced),
        duplicate=bool(duplicate),
        erased=bool(erased),
        mail_id=mail_id,
        jobs=int(jobs),
    )
