"""Review: an operator accepts, corrects or re-runs a NEEDS_CHECK or ERROR file (ARCHITECTURE.md).

Accept and correct are attempts of their own: a ``recognition_job`` row of kind
``manual`` (status ``done``, the operator's id, the time) with its document,
beside the automatic attempts; it becomes the file's current job and the file
goes RECOGNIZED. Rerun is a replay of the current attempt (``replay.py``). The
mail is reopened and finalized again, so its notification goes out with the new
final state (the dedupe key carries ``finalized_at``). Every action is one
audit event.

Two operators on one file: the file row is locked with NOWAIT, so the second
gets ``ReviewConflict`` at once instead of waiting (retryable: the lock is
released when the other change commits); one who acts on what they saw before
another's review finds the file no longer NEEDS_CHECK or ERROR and gets
``ReviewRefused`` naming who reviewed it. Nothing is overwritten.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession

from mailroom.db.audit import OPERATOR, add_audit_event
from mailroom.db.clock import db_now
from mailroom.db.models import FINAL_JOB_STATUSES
from mailroom.errors import ReplayRefused, ReviewConflict, ReviewRefused
from mailroom.recognition.finality import MAX_REASON_CHARS, finalize_mails, reopen_mail
from mailroom.recognition.replay import ReplayedJob, replay_job
from mailroom.recognition.review.queries import REVIEWABLE
from mailroom.recognition.review.values import typed_corrections
from mailroom.settings import RecognitionSettings

logger = logging.getLogger(__name__)

#: Postgres' SQLSTATEs of a held NOWAIT lock and of a deadlock with the pipeline (whose
#: transaction wins): both mean someone else is changing the file right now.
CONFLICT_SQLSTATES = ("55P03", "40P01")
#: Longest value kept per field in the audit event, in characters.
MAX_AUDIT_VALUE_CHARS = 200
#: Confidence of a value an operator typed.
OPERATOR_CONFIDENCE = 1.0

ReviewAction = Literal["accepted", "corrected", "rerun"]


@dataclass
class ReviewOutcome:
    """What one review action did."""

    file_id: int
    action: ReviewAction
    #: The new attempt: a manual job (accept, correct) or the queued replay (rerun).
    job_id: uuid.UUID
    attempt: int
    file_status: str
    document_id: int | None = None
    #: Mails this action made final again: their notifications are due.
    finalized_mail_ids: list[int] = field(default_factory=list)


_LOCK_FILE = text(
    """
    SELECT f.id, f.status, f.mail_id, f.current_recognition_job_id AS job_id,
           j.kind, j.operator_id, j.finished_at
      FROM stored_file AS f
      LEFT JOIN recognition_job AS j ON j.id = f.current_recognition_job_id
     WHERE f.id = :id
       FOR UPDATE OF f NOWAIT
    """
)

_LATEST_DOCUMENT = text(
    """
    SELECT d.id, d.document_type, d.fields, d.field_confidence, d.low_confidence_fields
      FROM document AS d WHERE d.file_id = :file_id ORDER BY d.id DESC LIMIT 1
    """
)

_LATEST_JOB = text(
    """
    SELECT pipeline, (SELECT max(attempt) FROM recognition_job WHERE file_id = :file_id) AS last
      FROM recognition_job WHERE file_id = :file_id ORDER BY attempt DESC LIMIT 1
    """
)

_INSERT_MANUAL_JOB = text(
    """
    INSERT INTO recognition_job (id, file_id, pipeline, status, attempt, kind, operator_id,
                                 requested_at, started_at, finished_at, mapped_at, metrics)
    VALUES (:id, :file_id, :pipeline, 'done', :attempt, 'manual', :operator,
            :now, :now, :now, :now, CAST(:metrics AS jsonb))
    """
)

_INSERT_DOCUMENT = text(
    """
    INSERT INTO document (file_id, job_id, document_type, fields, field_confidence,
                          missing_fields, low_confidence_fields, status, created_at)
    VALUES (:file_id, :job_id, :document_type, CAST(:fields AS jsonb),
            CAST(:field_confidence AS jsonb), CAST(:missing AS jsonb), CAST(:low AS jsonb),
            'ok', :now)
    RETURNING id
    """
)

_SETTLE_FILE = text(
    """
    UPDATE stored_file
       SET current_recognition_job_id = :job_id, status = 'RECOGNIZED', status_reason = :reason,
           updated_at = :now
     WHERE id = :file_id
    """
)


async def accept_file(
    session: AsyncSession,
    file_id: int,
    *,
    operator: str,
    settings: RecognitionSettings,
    now: datetime | None = None,
) -> ReviewOutcome:
    """Accept the file's document as it is, in the caller's transaction."""
    row = await _lock_reviewable(session, file_id)
    base = (await session.execute(_LATEST_DOCUMENT, {"file_id": file_id})).one_or_none()
    if base is None:
        raise ReviewRefused(
            f"file {file_id} has no document to accept; give its fields with "
            "'mailroom review correct' or run it again with 'mailroom review rerun'"
        )
    return await _settle_manually(
        session,
        row,
        action="accepted",
        operator=operator,
        document_type=base.document_type,
        fields=dict(base.fields),
        confidence=dict(base.field_confidence),
        changes={},
        settings=settings,
        now=now or await db_now(session),
    )


async def correct_file(
    session: AsyncSession,
    file_id: int,
    corrections: Mapping[str, str],
    *,
    operator: str,
    settings: RecognitionSettings,
    document_type: str | None = None,
    now: datetime | None = None,
) -> ReviewOutcome:
    """Set fields (and optionally the document type) on top of the file's latest document."""
    if not corrections and document_type is None:
        raise ReviewRefused("nothing to correct: give --field name=value (or --type)")
    row = await _lock_reviewable(session, file_id)
    base = (await session.execute(_LATEST_DOCUMENT, {"file_id": file_id})).one_or_none()
    doc_type = document_type or (base.document_type if base else None)
    if doc_type is None:
        raise ReviewRefused(f"file {file_id} has no document yet: give its type with --type")
    if doc_type not in settings.document_types:
        known = ", ".join(sorted(settings.document_types))
        raise ReviewRefused(f"unknown document type {doc_type[:100]!r}; known: {known}")
    fields = dict(base.fields) if base else {}
    typed = typed_corrections(corrections, fields, settings.document_types[doc_type])
    confidence = dict(base.field_confidence) if base else {}
    changes: dict[str, Any] = {}
    if base is not None and doc_type != base.document_type:
        changes["document_type"] = {"from": base.document_type, "to": doc_type}
    for name, value in typed.items():
        changes[name] = {"from": _cut(fields.get(name)), "to": _cut(value)}
        fields[name] = value
        confidence[name] = OPERATOR_CONFIDENCE
    return await _settle_manually(
        session,
        row,
        action="corrected",
        operator=operator,
        document_type=doc_type,
        fields=fields,
        confidence=confidence,
        changes=changes,
        settings=settings,
        now=now or await db_now(session),
    )


async def rerun_file(
    session: AsyncSession, file_id: int, *, operator: str, reason: str = ""
) -> ReplayedJob:
    """Give the file a new automatic attempt (a replay of its current one); nudge the publisher."""
    row = await _lock_reviewable(session, file_id)
    if row.job_id is None:
        raise ReviewRefused(f"file {file_id} was never sent to recognition; nothing to re-run")
    with _conflicts(file_id):  # the replay locks the job too, as the inbox and mapping do
        try:
            return await replay_job(
                session,
                row.job_id,
                actor_type=OPERATOR,
                actor_id=operator,
                reason=f"review rerun: {reason}".strip(": "),
                statuses=FINAL_JOB_STATUSES,
            )
        except ReplayRefused as exc:  # e.g. a job still waiting for its answer
            raise ReviewRefused(f"file {file_id}: {exc}") from exc


async def _lock_reviewable(session: AsyncSession, file_id: int) -> Any:
    """Lock the file row without waiting; refuse a file that is not (or no longer) reviewable."""
    with _conflicts(file_id):
        row = (await session.execute(_LOCK_FILE, {"id": file_id})).one_or_none()
    if row is None:
        raise ReviewRefused(f"file {file_id} does not exist")
    if row.status in REVIEWABLE:
        return row
    if row.kind == "manual":
        raise ReviewRefused(
            f"file {file_id} was reviewed meanwhile by {row.operator_id} at "
            f"{row.finished_at:%Y-%m-%d %H:%M:%S} UTC; it is {row.status} now"
        )
    raise ReviewRefused(
        f"file {file_id} is {row.status}; only {' and '.join(REVIEWABLE)} files are reviewed"
    )


@contextmanager
def _conflicts(file_id: int) -> Iterator[None]:
    """A held lock or a deadlock on the file is ``ReviewConflict``, said for people."""
    try:
        yield
    except OperationalError as exc:
        if getattr(exc.orig, "sqlstate", None) in CONFLICT_SQLSTATES:
            raise ReviewConflict(
                f"file {file_id} is being changed right now (another operator or the pipeline); "
                f"look at it again with 'mailroom review show {file_id}'"
            ) from exc
        raise


async def _settle_manually(
    session: AsyncSession,
    row: Any,
    *,
    action: ReviewAction,
    operator: str,
    document_type: str,
    fields: dict[str, Any],
    confidence: dict[str, Any],
    changes: dict[str, Any],
    settings: RecognitionSettings,
    now: datetime,
) -> ReviewOutcome:
    """Write the manual attempt and its document, settle the file, finalize its mail, audit."""
    latest = (await session.execute(_LATEST_JOB, {"file_id": row.id})).one_or_none()
    if latest is None:
        raise ReviewRefused(f"file {row.id} was never sent to recognition; nothing to review")
    job_id, attempt = uuid.uuid4(), latest.last + 1
    metrics = {"review": action, "based_on": str(row.job_id) if row.job_id else None}
    await session.execute(
        _INSERT_MANUAL_JOB,
        {
            "id": job_id,
            "file_id": row.id,
            "pipeline": latest.pipeline,
            "attempt": attempt,
            "operator": operator[:200],
            "now": now,
            "metrics": json.dumps(metrics),
        },
    )
    doc_type = settings.document_types.get(document_type)
    low = sorted(
        name
        for name, value in confidence.items()
        if isinstance(value, int | float) and value < settings.confidence_threshold
    )
    document_id = await session.scalar(
        _INSERT_DOCUMENT,
        {
            "file_id": row.id,
            "job_id": job_id,
            "document_type": document_type,
            "fields": json.dumps(fields),
            "field_confidence": json.dumps(confidence),
            # Kept for people reading the document: what an operator let through.
            "missing": json.dumps(doc_type.missing(fields) if doc_type else []),
            "low": json.dumps(low),
            "now": now,
        },
    )
    reason = f"{action} by {operator}"
    if changes:
        reason += f": {', '.join(sorted(changes))}"
    await session.execute(
        _SETTLE_FILE,
        {"job_id": job_id, "file_id": row.id, "reason": reason[:MAX_REASON_CHARS], "now": now},
    )
    outcome = ReviewOutcome(row.id, action, job_id, attempt, "RECOGNIZED", document_id)
    if row.mail_id is not None:
        await reopen_mail(session, row.mail_id)
        outcome.finalized_mail_ids = await finalize_mails(session, [row.mail_id], now=now)
    add_audit_event(
        session,
        actor_type=OPERATOR,
        actor_id=operator[:200],
        action=f"review.{action}",
        target=f"stored_file:{row.id}",
        detail={
            "job_id": str(job_id),
            "attempt": attempt,
            "previous_job_id": str(row.job_id) if row.job_id else None,
            "previous_status": row.status,
            "document_id": document_id,
            "changes": changes,
        },
    )
    logger.info("File %d %s by %s (attempt %d, job %s)", row.id, action, operator, attempt, job_id)
    return outcome


def _cut(value: Any) -> Any:
    """``value`` for the audit trail: long text is cut, numbers and null kept as they are."""
    if isinstance(value, str) and len(value) > MAX_AUDIT_VALUE_CHARS:
        return value[: MAX_AUDIT_VALUE_CHARS - 1] + "…"
    return value
