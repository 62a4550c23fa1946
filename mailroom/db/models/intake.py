"""The tables of intake: mailbox cursors, mails, stored objects and files."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    BigInteger,
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
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from mailroom.db.models.base import Base, in_values, now_column, references_index

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


class MailboxCursor(Base):
    """Where intake stands in one (mailbox, folder), and who holds its lease."""

    __tablename__ = "mailbox_cursor"
    __table_args__ = (
        UniqueConstraint("mailbox", "folder"),
        CheckConstraint(in_values("status", CURSOR_STATUSES), name="status"),
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
    #: Why the whole mailbox is blocked (``LOGIN_REFUSED``, ``FOLDER_MISSING``,
    #: ``TLS_UNVERIFIED``); empty when it is blocked at a mail (``blocked_uid``) or not at all.
    blocked_reason: Mapped[str | None] = mapped_column(String(40))
    last_error: Mapped[str | None] = mapped_column(Text)
    #: Claims in a row that stood at this ``last_uid`` and never recorded an end (the worker died).
    attempt_uid: Mapped[int | None] = mapped_column(BigInteger)
    attempt_count: Mapped[int] = mapped_column(Integer, server_default="0")
    #: When the scheduler's pass sent a poll that no claim has taken yet (one queued at a time).
    poll_queued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: A poll found the cursor leased by a running one, which may have searched the folder
    #: before the mail it was sent for came: the running poll sends the next one at its end.
    poll_again: Mapped[bool] = mapped_column(server_default=text("false"))
    #: A watcher announces this folder's new mail until then (renewed each lease round): the
    #: scheduler's pass polls it only every ``intake.watched_poll_interval_s``.
    watched_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = now_column()
    updated_at: Mapped[datetime] = now_column()


class InboundMail(Base):
    """One mail read from a folder, keyed by (cursor, uidvalidity, uid)."""

    __tablename__ = "inbound_mail"
    __table_args__ = (
        UniqueConstraint("cursor_id", "uidvalidity", "uid", name="cursor_uid"),
        CheckConstraint(in_values("status", MAIL_STATUSES), name="status"),
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
        references_index("inbound_mail", "raw_object_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    cursor_id: Mapped[int] = mapped_column(ForeignKey("mailbox_cursor.id"))
    uidvalidity: Mapped[int] = mapped_column(BigInteger)
    uid: Mapped[int] = mapped_column(BigInteger)
    message_id: Mapped[str | None] = mapped_column(Text)
    content_sha256: Mapped[str | None] = mapped_column(String(64))
    sender: Mapped[str | None] = mapped_column(Text)
    #: The From address's display name, decoded.
    sender_name: Mapped[str | None] = mapped_column(Text)
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
    created_at: Mapped[datetime] = now_column()


class StoredObject(Base):
    """An object in the object store, registered once per (bucket, key)."""

    __tablename__ = "stored_object"
    __table_args__ = (
        UniqueConstraint("bucket", "key", name="bucket_key"),
        CheckConstraint(in_values("bucket_role", BUCKET_ROLES), name="bucket_role"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    bucket_role: Mapped[str] = mapped_column(String(20))
    bucket: Mapped[str] = mapped_column(String(255))
    key: Mapped[str] = mapped_column(String(1024))
    size: Mapped[int | None] = mapped_column(BigInteger)
    sha256: Mapped[str | None] = mapped_column(String(64))
    media_type: Mapped[str | None] = mapped_column(String(255))
    created_by: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = now_column()


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
    requested_at: Mapped[datetime] = now_column()


class StoredFile(Base):
    """An attachment (or uploaded file) and where its recognition stands."""

    __tablename__ = "stored_file"
    # NOTE: the table has a fill factor of 70 (migration 0015): a status change finds room
    # on its page and updates the row in place, with no index entries.
    __table_args__ = (
        CheckConstraint(in_values("status", FILE_STATUSES), name="status"),
        references_index("stored_file", "object_id"),
        references_index("stored_file", "parent_file_id"),
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
    created_at: Mapped[datetime] = now_column()
    updated_at: Mapped[datetime] = now_column()


class ErasedMail(Base):
    """What is left of an erased mail: enough to know it again, nothing of its content.

    Intake skips a mail that matches one (same content, or same Message-ID), wherever it is
    read again: a cursor moved back, a changed UIDVALIDITY, a copy in another folder.
    """

    __tablename__ = "erased_mail"
    __table_args__ = (
        CheckConstraint(
            "content_sha256 IS NOT NULL OR message_id_sha256 IS NOT NULL", name="something"
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    #: SHA-256 of the mail as received (``inbound_mail.content_sha256``).
    content_sha256: Mapped[str | None] = mapped_column(String(64), index=True)
    #: SHA-256 of its Message-ID (the identifier itself is not kept).
    message_id_sha256: Mapped[str | None] = mapped_column(String(64), index=True)
    erased_at: Mapped[datetime] = now_column()
