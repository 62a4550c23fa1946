"""erased_mail: the tombstone an erased mail leaves, so intake never stores it again

The SHA-256 of the mail's bytes and of its Message-ID, nothing of its content. Intake skips
a mail that matches either, on every path that reads a mail again (a cursor moved back, a
changed UIDVALIDITY, a copy in another folder).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04 15:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "erased_mail",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("content_sha256", sa.String(length=64), nullable=True),
        sa.Column("message_id_sha256", sa.String(length=64), nullable=True),
        sa.Column(
            "erased_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "content_sha256 IS NOT NULL OR message_id_sha256 IS NOT NULL",
            name=op.f("ck_erased_mail_something"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_erased_mail")),
    )
    op.create_index(
        op.f("ix_erased_mail_content_sha256"), "erased_mail", ["content_sha256"], unique=False
    )
    op.create_index(
        op.f("ix_erased_mail_message_id_sha256"), "erased_mail", ["message_id_sha256"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_erased_mail_message_id_sha256"), table_name="erased_mail")
    op.drop_index(op.f("ix_erased_mail_content_sha256"), table_name="erased_mail")
    op.drop_table("erased_mail")
