"""retention_and_erasure: purged and legal-hold marks on mails, the object deletion queue

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 20:45:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("inbound_mail", sa.Column("purged_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "inbound_mail",
        sa.Column("legal_hold", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.create_index(
        "ix_inbound_mail_retention",
        "inbound_mail",
        ["cursor_id", "created_at"],
        unique=False,
        postgresql_where=sa.text("purged_at IS NULL"),
    )
    op.create_table(
        "object_deletion",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.String(length=255), nullable=False),
        sa.Column("key", sa.String(length=1024), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column(
            "requested_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_object_deletion")),
        sa.UniqueConstraint("bucket", "key", name=op.f("uq_object_deletion_bucket")),
    )


def downgrade() -> None:
    op.drop_table("object_deletion")
    op.drop_index(
        "ix_inbound_mail_retention",
        table_name="inbound_mail",
        postgresql_where=sa.text("purged_at IS NULL"),
    )
    op.drop_column("inbound_mail", "legal_hold")
    op.drop_column("inbound_mail", "purged_at")
