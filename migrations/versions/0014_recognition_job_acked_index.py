"""recognition_job: the health gate's ack index holds acked jobs only

``ix_recognition_job_acked`` (the gate's last ack per pipeline) held every automatic job,
also each one still waiting for its ack: every new job and every publish, and every result
that came without an ack, added an entry with a NULL ``started_at``, one more in a run of
equal (pipeline, NULL) keys that no query reads (``max`` skips NULLs). Server-side, 100-row
updates of jobs left unacked took 14–16 µs a row with the narrower index against 19–25.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02 05:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


ACKED_ONLY = "kind = 'automatic' AND started_at IS NOT NULL"
EVERY_AUTOMATIC = "kind = 'automatic'"


def _recreate(where: str) -> None:
    op.drop_index("ix_recognition_job_acked", table_name="recognition_job")
    op.create_index(
        "ix_recognition_job_acked",
        "recognition_job",
        ["pipeline", "started_at"],
        unique=False,
        postgresql_where=sa.text(where),
    )


def upgrade() -> None:
    _recreate(ACKED_ONLY)


def downgrade() -> None:
    _recreate(EVERY_AUTOMATIC)
