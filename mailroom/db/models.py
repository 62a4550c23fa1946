"""SQLAlchemy 2 models of every table (state machines: ARCHITECTURE.md).

All timestamps are ``timestamptz`` in UTC; status columns are check-constrained
text so a status added later is one migration, not an enum type dance.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

CURSOR_STATUSES = ("idle", "processing", "failed", "blocked")
MAIL_STATUSES = ("received", "stored", "failed", "final")
BUCKET_ROLES = ("mail", "incoming", "results")
#: CONTAINER: a forwarded mail or winmail.dat, stored whole; its files are rows of their own.
FILE_STATUSES = (
    "UPLOADED",
    "PROCESSING",
    "RECOGNIZED",
    "NEEDS_CHECK",
    "ERROR",
    "SKIPPED",
    "CONTAINER",
)
FINAL_FILE_STATUSES = ("RECOGNIZED", "NEEDS_CHECK", "ERROR", "SKIPPED", "CONTAINER")
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
MESSAGE_STATUSES = ("pending", "sending", "delivered", "partial_failed", "failed", "uncertain")
FINAL_MESSAGE_STATUSES = ("delivered", "partial_failed", "failed", "uncertain")


def _in(column: str, values: tuple[str, ...]) -> str:
    quoted = ", ".join(f"'{v}'" for v in values)
    return f"{column} IN ({quoted})"


def _references(table: str, column: str) -> Index:
    """The index Postgres looks up the rows referring to a deleted row by (its foreign key
    ``column``): without one, each deleted row reads all of ``table``. Partial: only rows
    that refer to something have an entry."""
    return Index(f"ix_{table}_{column}", column, postgresql_where=text(f"{column} IS NOT NULL"))


def _now() -> Any:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class MailboxCursor(Base):
    """Where intake stands in one (mailbox, folder), and who holds its lease."""

    __tablename__ = "mailbox_cursor"
    __table_args__ = (
        UniqueConstraint("mailbox", "folder"),
        CheckConstraint(_in("status", CURSOR_STATUSES), name="status"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    mailbox: Mapped[str] = mapped_column(String(200))
    folder: Mapped[str] = mapped_column(String(500))
    uidvalidity: Mapped[int | None] = mapped_column(BigInteger)
    last_uid: Mapped[int] = mapped_column(BigInteger, server_default="0")
    status: Mapped[str] = mapped_column(String(20), server_default="idle")
    lease_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    retry_count: Mapped[int] = mapped_column(Integer, server_default="0")
    next_retry_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    blocked_uid: Mapped[int | None] = mapped_column(BigInteger)
    blocked_message_id: Mapped[str | None] = mapped_column(Text)
    last_error: Mapped[str | None] = mapped_column(Text)
    #: Claims in a row that stood at this ``last_uid`` and never recorded an end (the worker died).
    attempt_uid: Mapped[int | None] = mapped_column(BigInteger)
    attempt_count: Mapped[int] = mapped_column(Integer, server_default="0")
    #: When the scheduler's pass sent a poll that no claim has taken yet (one queued at a time).
    poll_queued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()


class InboundMail(Base):
    """One mail read from a folder, keyed by (cursor, uidvalidity, uid)."""

    __tablename__ = "inbound_mail"
    __table_args__ = (
        UniqueConstraint("cursor_id", "uidvalidity", "uid", name="cursor_uid"),
        CheckConstraint(_in("status", MAIL_STATUSES), name="status"),
        Index("ix_inbound_mail_message_id_sha256", "message_id", "content_sha256"),
        # Final mails whose notifications are still to be created.
        Index(
            "ix_inbound_mail_unnotified",
            "finalized_at",
            postgresql_where=text("status = 'final' AND notified_at IS NULL"),
        ),
        # Stored mails, for the settle check of each notification pass: without it the pass
        # read every mail ever ingested (nearly all final) to find the few still stored.
        Index("ix_inbound_mail_stored", "id", postgresql_where=text("status = 'stored'")),
        # The retention pass's candidates: mails whose objects are still stored.
        Index(
            "ix_inbound_mail_retention",
            "cursor_id",
            "created_at",
            postgresql_where=text("purged_at IS NULL"),
        ),
        _references("inbound_mail", "raw_object_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    cursor_id: Mapped[int] = mapped_column(ForeignKey("mailbox_cursor.id"))
    uidvalidity: Mapped[int] = mapped_column(BigInteger)
    uid: Mapped[int] = mapped_column(BigInteger)
    message_id: Mapped[str | None] = mapped_column(Text)
    content_sha256: Mapped[str | None] = mapped_column(String(64))
    sender: Mapped[str | None] = mapped_column(Text)
    return_path: Mapped[str | None] = mapped_column(Text)
    authentication_results: Mapped[str | None] = mapped_column(Text)
    subject: Mapped[str | None] = mapped_column(Text)
    internal_date: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    raw_object_id: Mapped[int | None] = mapped_column(ForeignKey("stored_object.id"))
    status: Mapped[str] = mapped_column(String(20), server_default="received")
    retry_count: Mapped[int] = mapped_column(Integer, server_default="0")
    last_error: Mapped[str | None] = mapped_column(Text)
    last_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    next_retry_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finalized_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: When the notifications of its final state were created; NULL: still to do.
    notified_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: When retention removed its body, attachments and results (rows and documents stay).
    purged_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: A legal hold: neither retention nor ``intake erase`` touches the mail.
    legal_hold: Mapped[bool] = mapped_column(server_default=text("false"))
    created_at: Mapped[datetime] = _now()


class StoredObject(Base):
    """An object in the object store, registered once per (bucket, key)."""

    __tablename__ = "stored_object"
    __table_args__ = (
        UniqueConstraint("bucket", "key", name="bucket_key"),
        CheckConstraint(_in("bucket_role", BUCKET_ROLES), name="bucket_role"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    bucket_role: Mapped[str] = mapped_column(String(20))
    bucket: Mapped[str] = mapped_column(String(255))
    key: Mapped[str] = mapped_column(String(1024))
    size: Mapped[int | None] = mapped_column(BigInteger)
    sha256: Mapped[str | None] = mapped_column(String(64))
    media_type: Mapped[str | None] = mapped_column(String(255))
    created_by: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = _now()


class ObjectDeletion(Base):
    """An object to delete from the store, queued in the transaction that dropped its last row.

    Deleted from the store after that commit; a crash in between leaves the row for the
    retention pass to finish (``mailroom/lifecycle``).
    """

    __tablename__ = "object_deletion"
    __table_args__ = (UniqueConstraint("bucket", "key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    bucket: Mapped[str] = mapped_column(String(255))
    key: Mapped[str] = mapped_column(String(1024))
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    last_error: Mapped[str | None] = mapped_column(Text)
    requested_at: Mapped[datetime] = _now()


class StoredFile(Base):
    """An attachment (or uploaded file) and where its recognition stands."""

    __tablename__ = "stored_file"
    # NOTE: the table has a fill factor of 70 (migration 0015): a status change finds room
    # on its page and updates the row in place, with no index entries.
    __table_args__ = (
        CheckConstraint(_in("status", FILE_STATUSES), name="status"),
        _references("stored_file", "object_id"),
        _references("stored_file", "parent_file_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    mail_id: Mapped[int | None] = mapped_column(ForeignKey("inbound_mail.id"), index=True)
    object_id: Mapped[int | None] = mapped_column(ForeignKey("stored_object.id"))
    original_name: Mapped[str] = mapped_column(String(255))
    file_type: Mapped[str] = mapped_column(String(20))
    media_type: Mapped[str | None] = mapped_column(String(255))
    size: Mapped[int | None] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(20), server_default="UPLOADED")
    status_reason: Mapped[str | None] = mapped_column(Text)
    #: Not a foreign key: job and file point at each other.
    current_recognition_job_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    #: The container (forwarded mail, winmail.dat) this file was extracted from.
    parent_file_id: Mapped[int | None] = mapped_column(ForeignKey("stored_file.id"))
    #: Where the file sits in its mail: ``forwarded.eml/invoice.csv``.
    source_path: Mapped[str | None] = mapped_column(Text)
    #: Which rule decided ``file_type``: extension, media_type or content.
    type_rule: Mapped[str | None] = mapped_column(String(20))
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()


class RecognitionJob(Base):
    """One attempt at recognizing one file; replays add rows, never rewrite them."""

    __tablename__ = "recognition_job"
    __table_args__ = (
        UniqueConstraint("file_id", "attempt", name="file_attempt"),
        CheckConstraint(_in("status", JOB_STATUSES), name="status"),
        CheckConstraint(_in("pipeline", PIPELINES), name="pipeline"),
        CheckConstraint(_in("kind", JOB_KINDS), name="kind"),
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
        _references("recognition_job", "result_object_id"),
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
    requested_at: Mapped[datetime] = _now()
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
    started_at: Mapped[datetime] = _now()


class Document(Base):
    """The record a recognized file became."""

    __tablename__ = "document"
    __table_args__ = (
        UniqueConstraint("job_id", name="job"),
        CheckConstraint(_in("status", DOCUMENT_STATUSES), name="status"),
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
    created_at: Mapped[datetime] = _now()


class ChannelMessage(Base):
    """One outbound notification and its delivery state."""

    __tablename__ = "channel_message"
    __table_args__ = (
        UniqueConstraint("dedupe_key", name="dedupe_key"),
        CheckConstraint(_in("status", MESSAGE_STATUSES), name="status"),
        # Pending-delivery re-add sweep and stale recovery.
        Index(
            "ix_channel_message_open",
            "status",
            "enqueued_at",
            postgresql_where=text("status IN ('pending', 'sending')"),
        ),
        _references("channel_message", "document_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    channel: Mapped[str] = mapped_column(String(50))
    account: Mapped[str] = mapped_column(String(100), server_default="default")
    recipient: Mapped[str] = mapped_column(Text)
    subject: Mapped[str | None] = mapped_column(Text)
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(20), server_default="pending")
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    next_retry_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(Text)
    chunks: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    sending_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    dedupe_key: Mapped[str | None] = mapped_column(String(255))
    mail_id: Mapped[int | None] = mapped_column(ForeignKey("inbound_mail.id"), index=True)
    document_id: Mapped[int | None] = mapped_column(ForeignKey("document.id"))
    created_at: Mapped[datetime] = _now()


class RecognitionGate(Base):
    """When the recognition health gate of a pipeline closed and why (ARCHITECTURE.md).

    Not the decision itself (computed from the jobs each pass): the memory that lets the
    close be reported once and the reopening refresh the held jobs once.
    """

    __tablename__ = "recognition_gate"

    pipeline: Mapped[str] = mapped_column(String(20), primary_key=True)
    closed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    reason: Mapped[str | None] = mapped_column(Text)
    changed_at: Mapped[datetime] = _now()


class AuditEvent(Base):
    """Who did what to which record, for operators."""

    __tablename__ = "audit_event"
    __table_args__ = (Index("ix_audit_event_action_created_at", "action", "created_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    actor_type: Mapped[str] = mapped_column(String(50))
    actor_id: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(100))
    target: Mapped[str] = mapped_column(Text)
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    created_at: Mapped[datetime] = _now()


CONFIG_KINDS = ("mailbox", "account", "route")
#: ``settings``: seeded from the environment (re-seeded while unchanged); ``operator``: changed
#: through the CLI, never overwritten by a seed.
CONFIG_SOURCES = ("settings", "operator")


class RuntimeConfig(Base):
    """A mailbox, channel account or notification route managed at runtime (ARCHITECTURE.md).

    ``config`` is the settings model's JSON with every secret Fernet-encrypted;
    ``version`` comes from one sequence, so the highest version changes on every write.
    """

    __tablename__ = "runtime_config"
    __table_args__ = (
        CheckConstraint(_in("kind", CONFIG_KINDS), name="kind"),
        CheckConstraint(_in("source", CONFIG_SOURCES), name="source"),
    )

    kind: Mapped[str] = mapped_column(String(20), primary_key=True)
    #: Mailbox name, ``channel:account``, or the route's name.
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    enabled: Mapped[bool] = mapped_column(Boolean, server_default=text("true"))
    version: Mapped[int] = mapped_column(BigInteger)
    source: Mapped[str] = mapped_column(String(20))
    config: Mapped[dict[str, Any]] = mapped_column(JSONB)
    updated_by: Mapped[str] = mapped_column(String(200))
    updated_at: Mapped[datetime] = _now()
