"""cursor_claim_attempts: claims at one UID counted before the batch

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 15:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('mailbox_cursor', sa.Column('attempt_uid', sa.BigInteger(), nullable=True))
    op.add_column(
        'mailbox_cursor',
        sa.Column('attempt_count', sa.Integer(), server_default='0', nullable=False),
    )


def downgrade() -> None:
    op.drop_column('mailbox_cursor', 'attempt_count')
    op.drop_column('mailbox_cursor', 'attempt_uid')
