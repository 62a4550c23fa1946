"""outbox claim order: the publisher's candidates in the order it claims them

The outbox claims its oldest candidates first (``ORDER BY requested_at, id``) with
``FOR UPDATE SKIP LOCKED``. Without an index in that order Postgres reads and sorts
every queued and waiting job on each pass to take the first batch (about 100 ms a
pass at 20,000 queued jobs); with it, a pass reads about as many rows as it claims.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 00:25:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_recognition_job_claim",
        "recognition_job",
        ["requested_at", "id"],
        unique=False,
        postgresql_where=sa.text("status IN ('queued', 'published')"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_recognition_job_claim",
        table_name="recognition_job",
        postgresql_where=sa.text("status IN ('queued', 'published')"),
    )
