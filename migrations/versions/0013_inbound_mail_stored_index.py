"""inbound_mail: a partial index of the stored mails for the settle check

Each notification pass that is asked to settle looks for stored mails whose files are all
final (``finality._SETTLED_STORED_MAILS``). Nothing indexed the mails by status, so it read
the whole table, which holds every mail ever ingested, nearly all of them final: a cost
that grew with the history. The index holds only the mails still ``stored``.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 16:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_inbound_mail_stored",
        "inbound_mail",
        ["id"],
        unique=False,
        postgresql_where=sa.text("status = 'stored'"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_inbound_mail_stored",
        table_name="inbound_mail",
        postgresql_where=sa.text("status = 'stored'"),
    )
