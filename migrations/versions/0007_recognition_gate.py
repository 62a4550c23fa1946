"""recognition_gate: the health gate's state per pipeline, and indexes for its answer clock

The gate's decision is computed from the jobs each pass (last ack or result against the
oldest unacked request); the row only remembers when it closed and why, so the close is
reported once and the reopening refreshes the held jobs once (ARCHITECTURE.md, Recognition).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 21:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "recognition_gate",
        sa.Column("pipeline", sa.String(length=20), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True)),
        sa.Column("reason", sa.Text()),
        sa.Column(
            "changed_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("pipeline", name=op.f("pk_recognition_gate")),
    )
    op.create_index(
        "ix_recognition_job_acked",
        "recognition_job",
        ["pipeline", "started_at"],
        postgresql_where=sa.text("kind = 'automatic'"),
    )
    op.create_index(
        "ix_recognition_job_answered",
        "recognition_job",
        ["pipeline", "finished_at"],
        postgresql_where=sa.text("result_msg_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_recognition_job_answered", table_name="recognition_job")
    op.drop_index("ix_recognition_job_acked", table_name="recognition_job")
    op.drop_table("recognition_gate")
