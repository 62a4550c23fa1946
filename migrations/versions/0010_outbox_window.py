"""outbox window: queued jobs per pipeline in claim order

Flow control (``recognition.max_unacked_per_pipeline``) claims each pipeline's
queued jobs on their own, oldest first, up to the free places of its window, and
republishes from the few published ones. ``ix_recognition_job_claim`` (queued and
published together, in claim order) served neither: with a full window a claim
walked every queued job of a backlog to find none it may take, and one pipeline's
claim walked the other's. It is replaced by the queued jobs per pipeline in claim
order; the published ones are counted and read through ``ix_recognition_job_outbox``.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 07:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_recognition_job_queued",
        "recognition_job",
        ["pipeline", "requested_at", "id"],
        unique=False,
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.drop_index(
        "ix_recognition_job_claim",
        table_name="recognition_job",
        postgresql_where=sa.text("status IN ('queued', 'published')"),
    )


def downgrade() -> None:
    op.create_index(
        "ix_recognition_job_claim",
        "recognition_job",
        ["requested_at", "id"],
        unique=False,
        postgresql_where=sa.text("status IN ('queued', 'published')"),
    )
    op.drop_index(
        "ix_recognition_job_queued",
        table_name="recognition_job",
        postgresql_where=sa.text("status = 'queued'"),
    )
