"""The tables of recognition: jobs, inbox batch attempts, documents and the health gate."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from mailroom.db.models.base import Base, in_values, now_column, references_index

PIPELINES = ("tabular", "image")
JOB_STATUSES = (
    "queued",
    "published",
    "processing",
    "done",
    "needs_check",
    "error",
    "timeout",
    "dlq",
)
FINAL_JOB_STATUSES = ("done", "needs_check", "error", "timeout", "dlq")
#: automatic: a recognition service's attempt; manual: an operator's review (accept, correct).
JOB_KINDS = ("automatic", "manual")
DOCUMENT_STATUSES = ("ok", "needs_check")


class RecognitionJob(Base):
    """One attempt at recognizing one file; replays add rows, never rewrite them."""

    __tablename__ = "recognition_job"
    __table_args__ = (
        UniqueConstraint("file_id", "attempt", name="file_attempt"),
        CheckConstraint(in_values("status", JOB_STATUSES), name="status"),
        CheckConstraint(in_values("pipeline", PIPELINES), name="pipeline"),
        CheckConstraint(in_values("kind", JOB_KINDS), name="kind"),
        # The outbox publisher's candidates: queued, or published and waiting for an ack.
        Index(
            "ix_recognition_job_outbox",
            "status",
            "published_at",
            postgresql_where=text("status IN ('queued', 'published')"),
        ),
        # Each pipeline's queued jobs in the order the publisher claims them into its window.
        Index(
            "ix_recognition_job_queued",
            "pipeline",
            "requested_at",
            "id",
            postgresql_where=text("status = 'queued'"),
        ),
        # The watchdog's candidates.
        Index(
            "ix_recognition_job_deadline",
            "reply_deadline",
            postgresql_where=text("status IN ('published', 'processing')"),
        ),
        # The sweep for results left unmapped.
        Index(
            "ix_recognition_job_unmapped",
            "finished_at",
            postgresql_where=text(
                "status IN ('done', 'needs_check', 'error') AND mapped_at IS NULL"
                " AND result_msg_id IS NOT NULL"
            ),
        ),
        # The health gate's answer clock: the last ack and the last result per pipeline.
        # Acked jobs only: a job waiting for its ack (every new and every published one) has
        # no entry, where each was one more in a run of equal (pipeline, NULL) keys.
        Index(
            "ix_recognition_job_acked",
            "pipeline",
            "started_at",
            postgresql_where=text("kind = 'automatic' AND started_at IS NOT NULL"),
        ),
        Index(
            "ix_recognition_job_answered",
            "pipeline",
            "finished_at",
            postgresql_where=text("result_msg_id IS NOT NULL"),
        ),
        references_index("recognition_job", "result_object_id"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    # No index of its own: the unique key file_attempt (file_id, attempt) leads with it.
    file_id: Mapped[int] = mapped_column(ForeignKey("stored_file.id"))
    pipeline: Mapped[str] = mapped_column(String(20))
    status: Mapped[str] = mapped_column(String(20), server_default="queued")
    attempt: Mapped[int] = mapped_column(Integer, server_default="1")
    request_msg_id: Mapped[str | None] = mapped_column(String(200))
    request_subject: Mapped[str | None] = mapped_column(String(255))
    result_msg_id: Mapped[str | None] = mapped_column(String(200))
    reply_deadline: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    requested_at: Mapped[datetime] = now_column()
    published_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    service_name: Mapped[str | None] = mapped_column(String(200))
    service_version: Mapped[str | None] = mapped_column(String(100))
    error_code: Mapped[str | None] = mapped_column(String(100))
    error_message: Mapped[str | None] = mapped_column(Text)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    fields_total: Mapped[int | None] = mapped_column(Integer)
    fields_low_confidence: Mapped[int | None] = mapped_column(Integer)
    fields_unrecognized: Mapped[int | None] = mapped_column(Integer)
    result_schema_version: Mapped[str | None] = mapped_column(String(20))
    result_object_id: Mapped[int | None] = mapped_column(ForeignKey("stored_object.id"))
    mapped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    kind: Mapped[str] = mapped_column(String(20), server_default="automatic")
    #: Who made a manual attempt (``mailroom review``); NULL for automatic ones.
    operator_id: Mapped[str | None] = mapped_column(String(200))


class InboxBatchAttempt(Base):
    """An inbox batch's attempt at its jobs, written before the work (ARCHITECTURE.md, attempts).

    The batch deletes it in its own transaction; a row left over is a batch whose worker
    died, and makes the next batch holding one of these jobs apply its messages one by one.
    """

    __tablename__ = "inbox_batch_attempt"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    job_ids: Mapped[list[uuid.UUID]] = mapped_column(ARRAY(UUID(as_uuid=True)))
    started_at: Mapped[datetime] = now_column()


class Document(Base):
    """The record a recognized file became."""

    __tablename__ = "document"
    __table_args__ = (
        UniqueConstraint("job_id", name="job"),
        CheckConstraint(in_values("status", DOCUMENT_STATUSES), name="status"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    file_id: Mapped[int] = mapped_column(ForeignKey("stored_file.id"), index=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("recognition_job.id"))
    document_type: Mapped[str] = mapped_column(String(100))
    fields: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    field_confidence: Mapped[dict[str, Any]] = mapped_column(
        JSONB, server_default=text("'{}'::jsonb")
    )
    missing_fields: Mapped[list[str]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    low_confidence_fields: Mapped[list[str]] = mapped_column(
        JSONB, server_default=text("'[]'::jsonb")
    )
    status: Mapped[str] = mapped_column(String(20))
    created_at: Mapped[datetime] = now_column()


class RecognitionGate(Base):
    """When the recognition health gate of a pipeline closed and why (ARCHITECTURE.md).

    Not the decision itself (computed from the jobs each pass): the memory that lets the
    close be reported once and the reopening refresh the held jobs once.
    """

    __tablename__ = "recognition_gate"

    pipeline: Mapped[str] = mapped_column(String(20), primary_key=True)
    closed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    reason: Mapped[str | None] = mapped_column(Text)
    changed_at: Mapped[datetime] = now_column()
