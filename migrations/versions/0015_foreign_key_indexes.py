"""Index every foreign key to a table rows are deleted from; stored_file pages keep room

Deleting a row makes Postgres look up the rows that refer to it, through each foreign key
to its table; four referring columns had no index, so each deleted row read a whole
table: every object retention or erasure releases read ``inbound_mail``, ``stored_file``
and ``recognition_job`` in full (three scans per object, each as long as the history), and
each erased file and document read ``stored_file`` and ``channel_message``. The indexes
are partial: only rows that refer to something have an entry.

``stored_file`` gets a fill factor of 70: its status changes touch no indexed column, so
with room on the page Postgres updates a file in place (HOT) and enters nothing in its
indexes; on full pages every status change added an entry to each of them. The setting
applies to pages written from now on (``VACUUM FULL stored_file`` repacks the old ones).

The indexes are built ``CONCURRENTLY``, outside the migration's transaction: on a large
live database a plain build holds off every write to the table until it ends. An index of
the same name that is already there and valid (built by hand ahead of the upgrade) is
kept; one a failed concurrent build left invalid is dropped and built again.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02 06:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: (index, table, referring column)
FOREIGN_KEY_INDEXES = (
    ("ix_inbound_mail_raw_object_id", "inbound_mail", "raw_object_id"),
    ("ix_stored_file_object_id", "stored_file", "object_id"),
    ("ix_stored_file_parent_file_id", "stored_file", "parent_file_id"),
    ("ix_recognition_job_result_object_id", "recognition_job", "result_object_id"),
    ("ix_channel_message_document_id", "channel_message", "document_id"),
)


def upgrade() -> None:
    with op.get_context().autocommit_block():
        for name, table, column in FOREIGN_KEY_INDEXES:
            if _invalid(name):
                op.drop_index(name, table_name=table, postgresql_concurrently=True)
            op.create_index(
                name,
                table,
                [column],
                unique=False,
                postgresql_where=sa.text(f"{column} IS NOT NULL"),
                postgresql_concurrently=True,
                if_not_exists=True,
            )
    op.execute("ALTER TABLE stored_file SET (fillfactor = 70)")


def _invalid(name: str) -> bool:
    """True when ``name`` is an index a failed ``CREATE INDEX CONCURRENTLY`` left behind."""
    if context.is_offline_mode():
        return False  # a SQL script for later: nothing there to look at
    query = sa.text("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:name)")
    return bool(op.get_bind().execute(query, {"name": name}).scalar())


def downgrade() -> None:
    op.execute("ALTER TABLE stored_file RESET (fillfactor)")
    for name, table, _ in reversed(FOREIGN_KEY_INDEXES):
        op.drop_index(name, table_name=table)
