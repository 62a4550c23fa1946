"""mailbox_cursor.watched_until: a watcher announces this folder's new mail until then

The IMAP watcher renews it for every folder it watches live, each lease round. The
scheduler's pass polls such a folder only every ``intake.watched_poll_interval_s`` (a guard
against a missed announcement) instead of every pass: 1,000 watched mailboxes cost 2,000
empty polls a minute at a 30 s pass. A watch that drops stops renewing it, and within a
lease the pass polls the folder every interval again.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04 12:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "mailbox_cursor", sa.Column("watched_until", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("mailbox_cursor", "watched_until")
