"""poll_queued: when a poll of the cursor's mailbox was last sent and not yet claimed

The scheduler's pass sends a poll only to a mailbox without one queued (or running, or
backing off, or blocked), so a backlog on the intake queue never holds two polls of one
mailbox and every mailbox gets its turn (ARCHITECTURE.md, Intake).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 00:05:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("mailbox_cursor", sa.Column("poll_queued_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("mailbox_cursor", "poll_queued_at")
