"""runtime_config: mailboxes, channel accounts and routes managed at runtime

One table for the three kinds (primary key kind + name); ``version`` is drawn from
``runtime_config_version_seq`` on every write, so readers notice any change with one
``max(version)`` query (ARCHITECTURE.md, Runtime configuration).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 21:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("CREATE SEQUENCE runtime_config_version_seq")
    op.create_table(
        "runtime_config",
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("source", sa.String(length=20), nullable=False),
        sa.Column("config", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("updated_by", sa.String(length=200), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "kind IN ('mailbox', 'account', 'route')", name=op.f("ck_runtime_config_kind")
        ),
        sa.CheckConstraint(
            "source IN ('settings', 'operator')", name=op.f("ck_runtime_config_source")
        ),
        sa.PrimaryKeyConstraint("kind", "name", name=op.f("pk_runtime_config")),
    )


def downgrade() -> None:
    op.drop_table("runtime_config")
    op.execute("DROP SEQUENCE runtime_config_version_seq")
