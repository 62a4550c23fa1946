"""mailbox_cursor.poll_again: a poll asked for while another one ran

The IMAP watcher sends a poll when the server announces new mail. When that poll finds
the cursor leased by a poll already running (which may have searched the folder before the
mail came), its claim sets ``poll_again``; the running poll's finish reads it and sends the
next poll at once, so the mail waits for no scheduler pass. The next claim clears it.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04 12:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "mailbox_cursor",
        sa.Column("poll_again", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )


def downgrade() -> None:
    op.drop_column("mailbox_cursor", "poll_again")
