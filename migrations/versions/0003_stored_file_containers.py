"""stored_file_containers: files extracted from forwarded mails and winmail.dat, type rule

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 17:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_STATUSES = "('UPLOADED', 'PROCESSING', 'RECOGNIZED', 'NEEDS_CHECK', 'ERROR', 'SKIPPED')"
_NEW_STATUSES = (
    "('UPLOADED', 'PROCESSING', 'RECOGNIZED', 'NEEDS_CHECK', 'ERROR', 'SKIPPED', 'CONTAINER')"
)


def upgrade() -> None:
    op.add_column("stored_file", sa.Column("parent_file_id", sa.Integer(), nullable=True))
    op.add_column("stored_file", sa.Column("source_path", sa.Text(), nullable=True))
    op.add_column("stored_file", sa.Column("type_rule", sa.String(length=20), nullable=True))
    op.create_foreign_key(
        op.f("fk_stored_file_parent_file_id_stored_file"),
        "stored_file",
        "stored_file",
        ["parent_file_id"],
        ["id"],
    )
    op.drop_constraint(op.f("ck_stored_file_status"), "stored_file", type_="check")
    op.create_check_constraint(
        op.f("ck_stored_file_status"), "stored_file", f"status IN {_NEW_STATUSES}"
    )


def downgrade() -> None:
    op.execute("UPDATE stored_file SET status = 'SKIPPED' WHERE status = 'CONTAINER'")
    op.drop_constraint(op.f("ck_stored_file_status"), "stored_file", type_="check")
    op.create_check_constraint(
        op.f("ck_stored_file_status"), "stored_file", f"status IN {_OLD_STATUSES}"
    )
    op.drop_constraint(
        op.f("fk_stored_file_parent_file_id_stored_file"), "stored_file", type_="foreignkey"
    )
    op.drop_column("stored_file", "type_rule")
    op.drop_column("stored_file", "source_path")
    op.drop_column("stored_file", "parent_file_id")
