"""manual_recognition_attempts: recognition_job.kind (automatic / manual) and operator_id

An operator's review (accept, correct) is an attempt of its own, a row beside the
automatic ones, so a file's attempts read in one list (ARCHITECTURE.md, Review).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 20:55:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "recognition_job",
        sa.Column("kind", sa.String(length=20), server_default="automatic", nullable=False),
    )
    op.add_column("recognition_job", sa.Column("operator_id", sa.String(length=200)))
    op.create_check_constraint(
        op.f("ck_recognition_job_kind"), "recognition_job", "kind IN ('automatic', 'manual')"
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_recognition_job_kind"), "recognition_job", type_="check")
    op.drop_column("recognition_job", "operator_id")
    op.drop_column("recognition_job", "kind")
