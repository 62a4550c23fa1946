"""inbox batch attempts: one row per batch, not a count on each of its jobs

An inbox batch counted an attempt on each of its jobs (``metrics.inbox_batch_attempts``)
before it applied them, and gave it back in its write-back: each job row was written
twice per batch. The batch now writes one row naming its jobs before the work and
deletes it in its own transaction; a row left over is a batch whose worker died.
Counts left on jobs become rows of one job each (only whether one is left matters).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 10:25:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "inbox_batch_attempt",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("job_ids", postgresql.ARRAY(sa.UUID()), nullable=False),
        sa.Column(
            "started_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_inbox_batch_attempt")),
    )
    op.execute(
        "INSERT INTO inbox_batch_attempt (id, job_ids) "
        "SELECT gen_random_uuid(), ARRAY[id] FROM recognition_job "
        "WHERE metrics ? 'inbox_batch_attempts'"
    )
    op.execute(
        "UPDATE recognition_job SET metrics = metrics - 'inbox_batch_attempts' "
        "WHERE metrics ? 'inbox_batch_attempts'"
    )


def downgrade() -> None:
    op.execute(
        """
        UPDATE recognition_job AS j
           SET metrics = jsonb_set(j.metrics, '{inbox_batch_attempts}', to_jsonb(left_over.n))
          FROM (SELECT job_id, count(*) AS n
                  FROM inbox_batch_attempt, unnest(job_ids) AS job_id GROUP BY job_id) AS left_over
         WHERE j.id = left_over.job_id
        """
    )
    op.drop_table("inbox_batch_attempt")
