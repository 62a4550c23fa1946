"""What operators review: NEEDS_CHECK and ERROR files, their reasons, documents and attempts.

Read-only; the actions (accept, correct, rerun) are in ``review.py``. A file's
document is the newest one of its attempts: the current attempt's when it has
one, else an earlier attempt's (an ERROR retry after a NEEDS_CHECK document).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from mailroom.settings import RecognitionSettings

#: File statuses an operator reviews.
REVIEWABLE = ("NEEDS_CHECK", "ERROR")

#: Why a file waits, as a filter: the document misses a required field, has a field below
#: the confidence threshold, or the file's recognition failed.
REASONS = ("missing", "low_confidence", "error")


@dataclass(frozen=True)
class ReviewFilter:
    """Which waiting files to list; every filter left empty matches all."""

    mailbox: str | None = None
    #: Part of the sender's address, any case.
    sender: str | None = None
    document_type: str | None = None
    #: One of ``REASONS``.
    reason: str | None = None


@dataclass
class ReviewDocument:
    """A document as the review sees it, with the attempt that made it."""

    document_id: int
    attempt: int
    document_type: str
    fields: dict[str, Any]
    field_confidence: dict[str, Any]
    missing: list[str]
    low_confidence: list[str]

    @property
    def unrecognized(self) -> list[str]:
        """Fields the service named but gave no value."""
        return sorted(name for name, value in self.fields.items() if value in (None, ""))


@dataclass
class ReviewItem:
    """One file waiting for an operator, and why."""

    file_id: int
    status: str
    name: str
    reason: str | None
    mailbox: str | None
    mail_id: int | None
    job_id: uuid.UUID | None
    attempt: int | None
    error_code: str | None
    updated_at: datetime
    document: ReviewDocument | None = None
    #: The mail the file came in: who sent it, its subject and when it was received.
    sender: str | None = None
    subject: str | None = None
    received_at: datetime | None = None


@dataclass(frozen=True)
class Attempt:
    """One row of a file's attempts, automatic or manual."""

    job_id: uuid.UUID
    attempt: int
    kind: str
    status: str
    operator_id: str | None
    service_name: str | None
    requested_at: datetime
    finished_at: datetime | None
    error_code: str | None
    error_message: str | None
    current: bool


@dataclass
class ReviewFile:
    """``review show``: the file, its source object, its document and every attempt."""

    item: ReviewItem
    bucket: str | None
    key: str | None
    #: The document type's required rules (``investor_name|customer_id``), when it is known.
    required: list[str] | None
    attempts: list[Attempt] = field(default_factory=list)


_FILES = """
    SELECT f.id AS file_id, f.status, f.original_name, f.status_reason, f.updated_at,
           f.mail_id, c.mailbox, m.sender, m.subject,
           COALESCE(m.internal_date, m.created_at) AS received_at, j.id AS job_id, j.attempt, j.error_code,
           o.bucket, o.key,
           d.id AS document_id, dj.attempt AS document_attempt, d.document_type, d.fields,
           d.field_confidence, d.missing_fields, d.low_confidence_fields
      FROM stored_file AS f
      LEFT JOIN inbound_mail AS m ON m.id = f.mail_id
      LEFT JOIN mailbox_cursor AS c ON c.id = m.cursor_id
      LEFT JOIN recognition_job AS j ON j.id = f.current_recognition_job_id
      LEFT JOIN stored_object AS o ON o.id = f.object_id
      LEFT JOIN LATERAL (
            SELECT d.* FROM document AS d WHERE d.file_id = f.id ORDER BY d.id DESC LIMIT 1
      ) AS d ON TRUE
      LEFT JOIN recognition_job AS dj ON dj.id = d.job_id
"""

_LIST = text(
    _FILES
    + """
     WHERE f.status = ANY(:statuses)
       AND (CAST(:mailbox AS text) IS NULL OR c.mailbox = CAST(:mailbox AS text))
       AND (CAST(:sender AS text) IS NULL
            OR strpos(lower(m.sender), lower(CAST(:sender AS text))) > 0)
       AND (CAST(:document_type AS text) IS NULL
            OR d.document_type = CAST(:document_type AS text))
       AND (CAST(:reason AS text) IS NULL
            OR (CAST(:reason AS text) = 'missing' AND jsonb_array_length(d.missing_fields) > 0)
            OR (CAST(:reason AS text) = 'low_confidence' AND jsonb_array_length(d.low_confidence_fields) > 0)
            OR (CAST(:reason AS text) = 'error' AND f.status = 'ERROR'))
       AND (CAST(:after_at AS timestamptz) IS NULL
            OR (f.updated_at, f.id) > (CAST(:after_at AS timestamptz), :after_id))
     ORDER BY f.updated_at, f.id
     LIMIT :limit
    """
)

_ONE = text(_FILES + " WHERE f.id = :file_id")

_ATTEMPTS = text(
    """
    SELECT j.id, j.attempt, j.kind, j.status, j.operator_id, j.service_name, j.requested_at,
           j.finished_at, j.error_code, j.error_message,
           j.id = f.current_recognition_job_id AS current
      FROM recognition_job AS j
      JOIN stored_file AS f ON f.id = j.file_id
     WHERE j.file_id = :file_id
     ORDER BY j.attempt
    """
)


async def list_review_items(
    session: AsyncSession,
    *,
    limit: int,
    statuses: tuple[str, ...] = REVIEWABLE,
    mailbox: str | None = None,
    where: ReviewFilter | None = None,
    after: tuple[datetime, int] | None = None,
) -> list[ReviewItem]:
    """Up to ``limit`` files in ``statuses`` (oldest change first) that ``where`` matches.

    ``after`` (a file's ``updated_at`` and id): only the files queued behind that place.
    """
    where = where or ReviewFilter(mailbox=mailbox)
    rows = await session.execute(
        _LIST,
        {
            "statuses": list(statuses),
            "mailbox": where.mailbox or mailbox,
            "sender": where.sender or None,
            "document_type": where.document_type or None,
            "reason": where.reason or None,
            "after_at": after[0] if after else None,
            "after_id": after[1] if after else 0,
            "limit": limit,
        },
    )
    return [_item(row) for row in rows]


async def show_review_file(
    session: AsyncSession, file_id: int, *, settings: RecognitionSettings
) -> ReviewFile | None:
    """One file with its object reference, document, required rules and attempts; None if absent."""
    row = (await session.execute(_ONE, {"file_id": file_id})).one_or_none()
    if row is None:
        return None
    item = _item(row)
    doc_type = settings.document_types.get(item.document.document_type) if item.document else None
    attempts = [
        Attempt(
            job_id=a.id,
            attempt=a.attempt,
            kind=a.kind,
            status=a.status,
            operator_id=a.operator_id,
            service_name=a.service_name,
            requested_at=a.requested_at,
            finished_at=a.finished_at,
            error_code=a.error_code,
            error_message=a.error_message,
            current=bool(a.current),
        )
        for a in await session.execute(_ATTEMPTS, {"file_id": file_id})
    ]
    return ReviewFile(
        item=item,
        bucket=row.bucket,
        key=row.key,
        required=doc_type.labels() if doc_type else None,
        attempts=attempts,
    )


def _item(row: Any) -> ReviewItem:
    document = None
    if row.document_id is not None:
        document = ReviewDocument(
            document_id=row.document_id,
            attempt=row.document_attempt,
            document_type=row.document_type,
            fields=dict(row.fields or {}),
            field_confidence=dict(row.field_confidence or {}),
            missing=list(row.missing_fields or []),
            low_confidence=list(row.low_confidence_fields or []),
        )
    return ReviewItem(
        file_id=row.file_id,
        status=row.status,
        name=row.original_name,
        reason=row.status_reason,
        mailbox=row.mailbox,
        mail_id=row.mail_id,
        job_id=row.job_id,
        attempt=row.attempt,
        error_code=row.error_code,
        updated_at=row.updated_at,
        document=document,
        sender=row.sender,
        subject=row.subject,
        received_at=row.received_at,
    )
