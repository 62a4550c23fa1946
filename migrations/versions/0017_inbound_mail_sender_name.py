"""inbound_mail.sender_name: the From address's display name, decoded

Intake decodes it like the subject (encoded words, raw 8-bit bytes in the mail's own
charsets); mails stored before this revision have none.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("inbound_mail", sa.Column("sender_name", sa.Text()))


def downgrade() -> None:
    op.drop_column("inbound_mail", "sender_name")
