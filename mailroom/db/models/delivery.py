"""The table of delivery: outbound notifications and their delivery state."""

from __future__ import annotations

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
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from mailroom.db.models.base import Base, in_values, now_column, references_index

MESSAGE_STATUSES = ("pending", "sending", "delivered", "partial_failed", "failed", "uncertain")
FINAL_MESSAGE_STATUSES = ("delivered", "partial_failed", "failed", "uncertain")


class ChannelMessage(Base):
    """One outbound notification and its delivery state."""

    __tablename__ = "channel_message"
    __table_args__ = (
        UniqueConstraint("dedupe_key", name="dedupe_key"),
        CheckConstraint(in_values("status", MESSAGE_STATUSES), name="status"),
        # Pending-delivery re-add sweep and stale recovery.
        Index(
            "ix_channel_message_open",
            "status",
            "enqueued_at",
            postgresql_where=text("status IN ('pending', 'sending')"),
        ),
        references_index("channel_message", "document_id"),
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
    created_at: Mapped[datetime] = now_column()
