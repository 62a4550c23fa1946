"""The tables operators work with: the audit trail and the runtime configuration."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, CheckConstraint, Index, String, Text, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from mailroom.db.models.base import Base, in_values, now_column


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
    created_at: Mapped[datetime] = now_column()


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
        CheckConstraint(in_values("kind", CONFIG_KINDS), name="kind"),
        CheckConstraint(in_values("source", CONFIG_SOURCES), name="source"),
    )

    kind: Mapped[str] = mapped_column(String(20), primary_key=True)
    #: Mailbox name, ``channel:account``, or the route's name.
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    enabled: Mapped[bool] = mapped_column(Boolean, server_default=text("true"))
    version: Mapped[int] = mapped_column(BigInteger)
    source: Mapped[str] = mapped_column(String(20))
    config: Mapped[dict[str, Any]] = mapped_column(JSONB)
    updated_by: Mapped[str] = mapped_column(String(200))
    updated_at: Mapped[datetime] = now_column()
