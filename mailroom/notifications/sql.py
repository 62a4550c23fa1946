"""The notification pass's SQL: its mails claimed, stamped and summarized in one statement.

Text statements, compiled once per process (the ORM queries they replace cost more to
build and load than to run).
"""

from __future__ import annotations

from sqlalchemy import text

# What a summary needs of a mail, its mailbox and each of its files (one row per file, or a
# row with a NULL file for a mail without any), in mail and file order.
_SUMMARY_ROWS = """
    SELECT m.id AS mail_id, m.uid, m.subject, m.sender, m.sender_name, m.last_error, m.finalized_at,
           m.notified_at, c.mailbox, f.id AS file_id, f.original_name, f.status AS file_status,
           f.status_reason, d.document_type, d.fields, d.missing_fields
      FROM {mails} AS m
      LEFT JOIN mailbox_cursor AS c ON c.id = m.cursor_id
      LEFT JOIN stored_file AS f ON f.mail_id = m.id
      LEFT JOIN document AS d ON d.job_id = f.current_recognition_job_id
     ORDER BY m.id, f.id
"""

#: Summary rows of the given mails (``:ids``).
SUMMARIES = text(_SUMMARY_ROWS.format(mails="(SELECT * FROM inbound_mail WHERE id = ANY(:ids))"))

# Up to ``:limit`` final, un-notified mails, claimed with SKIP LOCKED so two passes never
# take one mail, stamped ``notified_at`` (``:now``, or the database's clock) in the same
# statement, with their summary rows. The caller's transaction also inserts the messages,
# so the stamp and the messages commit together or not at all.
CLAIM = text(
    """
    WITH picked AS (
        SELECT id FROM inbound_mail
         WHERE status = 'final' AND notified_at IS NULL
         ORDER BY id
         LIMIT :limit
           FOR UPDATE SKIP LOCKED
    ), stamped AS (
        UPDATE inbound_mail AS m
           SET notified_at = COALESCE(CAST(:now AS timestamptz), now())
          FROM picked
         WHERE m.id = picked.id
        RETURNING m.*
    )
    """
    + _SUMMARY_ROWS.format(mails="stamped")
)
