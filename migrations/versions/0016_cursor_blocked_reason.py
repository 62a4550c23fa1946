"""mailbox_cursor.blocked_reason: why a whole mailbox waits for a person

A mailbox whose login, folder or server certificate is refused poll after poll is blocked
(``LOGIN_REFUSED``, ``FOLDER_MISSING``, ``TLS_UNVERIFIED``); the reason tells the operator
what to fix and lets status and the alert rules count these apart from a mail that failed.
Empty for a cursor blocked at a mail (``blocked_uid`` says which) or not blocked.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("mailbox_cursor", sa.Column("blocked_reason", sa.String(length=40)))


def downgrade() -> None:
    op.drop_column("mailbox_cursor", "blocked_reason")
