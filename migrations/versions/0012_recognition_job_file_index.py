"""recognition_job: drop ix_recognition_job_file_id, which the file_attempt key covers

The unique key ``file_attempt`` (``file_id``, ``attempt``) leads with ``file_id``, so
every lookup of a file's jobs (and the foreign-key checks when files go) can use it;
the separate index on ``file_id`` only cost one more index entry per row version. A
job's status changes are not HOT updates (its partial indexes name the status), so
each insert, publish, ack, result and mapping wrote that entry again.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 13:10:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_recognition_job_file_id", table_name="recognition_job")


def downgrade() -> None:
    op.create_index("ix_recognition_job_file_id", "recognition_job", ["file_id"], unique=False)
