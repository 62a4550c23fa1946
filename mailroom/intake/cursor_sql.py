"""The cursor's one-round-trip statements (``lease.lease_write``), kept apart from the logic.

Each runs alone in autocommit, its own transaction, and commits asynchronously
(``cursor.lease_transaction`` says why that is safe for the lease's bookkeeping): the
statement itself sets ``synchronous_commit`` for its transaction (``ASYNC_COMMIT``), which
took a pipeline of four before (``BEGIN``, ``SET LOCAL``, the statement, ``COMMIT``) and
about twice the intake worker's CPU. A statement that writes no row sets nothing, and
commits nothing to flush. Times are the database's ``now()``, moved by ``%(offset)s`` only
where a test's clock runs ahead of it.
"""

from __future__ import annotations

#: A condition that is always true and makes the statement's own transaction commit
#: asynchronously (``SET LOCAL synchronous_commit = off`` as a function, usable in autocommit).
ASYNC_COMMIT = "set_config('synchronous_commit', 'off', true) = 'off'"

#: ``claim_cursor``'s statement: lock the cursor, clear its poll-queued mark, and take the
#: lease unless the cursor is blocked, leased or backing off (``skip`` says which). Returns
#: the row as it stood before (the lease taken over, the UIDs and attempts to go on from);
#: no row when the cursor does not exist yet. The lock comes first, so ``old`` is the row as
#: the last writer committed it, and the decision and the write see the same values.
CLAIM_CURSOR = f"""
WITH old AS (
    SELECT id, status, lease_id, lease_until, next_retry_at, uidvalidity, last_uid,
           retry_count, attempt_uid, attempt_count, now() + %(offset)s AS now
      FROM mailbox_cursor
     WHERE mailbox = %(mailbox)s AND folder = %(folder)s
       FOR UPDATE
), decided AS (
    SELECT old.*,
           CASE WHEN status = 'blocked' THEN 'blocked'
                WHEN lease_id IS NOT NULL AND lease_until > now THEN 'leased'
                WHEN next_retry_at > now THEN 'backoff'
           END AS skip
      FROM old
)
UPDATE mailbox_cursor AS c
   SET poll_queued_at = NULL,
       poll_again = d.skip IS NOT DISTINCT FROM 'leased',
       status = CASE WHEN d.skip IS NULL THEN 'processing' ELSE c.status END,
       lease_id = CASE WHEN d.skip IS NULL THEN %(lease_id)s ELSE c.lease_id END,
       lease_until = CASE WHEN d.skip IS NULL THEN d.now + %(lease)s ELSE c.lease_until END,
       updated_at = CASE WHEN d.skip IS NULL THEN d.now ELSE c.updated_at END
  FROM decided AS d
 WHERE c.id = d.id AND {ASYNC_COMMIT}
RETURNING d.skip, d.status, d.lease_id, d.id, d.uidvalidity, d.last_uid, d.retry_count,
          d.attempt_uid, d.attempt_count
"""

#: The first poll of a (mailbox, folder) creates its cursor; of two first polls that race,
#: the loser's insert does nothing.
CREATE_CURSOR = f"""
INSERT INTO mailbox_cursor (mailbox, folder)
SELECT CAST(%(mailbox)s AS text), CAST(%(folder)s AS text) WHERE {ASYNC_COMMIT}
ON CONFLICT (mailbox, folder) DO NOTHING
RETURNING id
"""

#: ``count_attempt``'s statement (SET sees the row as it was: the UID counted before).
COUNT_ATTEMPT = f"""
UPDATE mailbox_cursor
   SET attempt_count = CASE WHEN attempt_uid = %(uid)s THEN attempt_count + 1 ELSE 1 END,
       attempt_uid = %(uid)s
 WHERE id = %(cursor_id)s AND lease_id = %(lease_id)s AND {ASYNC_COMMIT}
RETURNING attempt_count
"""

#: ``adopt_uidvalidity``'s statement for a cursor that had none. Committed like the lease's
#: bookkeeping: lost with Postgres, the next poll stores it again (the mails it stores after
#: it flush the WAL up to themselves, this write included).
FIRST_UIDVALIDITY = f"""
UPDATE mailbox_cursor SET uidvalidity = %(uidvalidity)s, updated_at = now()
 WHERE id = %(cursor_id)s AND lease_id = %(lease_id)s AND {ASYNC_COMMIT}
RETURNING id
"""

#: ``finish_batch``'s statement; ``poll_again`` says whether a poll sent meanwhile found the
#: cursor leased (it stays set until the next claim, which reads the folder anyway).
FINISH_BATCH = f"""
UPDATE mailbox_cursor
   SET last_uid = greatest(last_uid, %(highest_uid)s), status = 'idle',
       lease_id = NULL, lease_until = NULL, retry_count = 0, attempt_count = 0,
       next_retry_at = NULL, last_error = NULL, updated_at = now()
 WHERE id = %(cursor_id)s AND lease_id = %(lease_id)s AND {ASYNC_COMMIT}
RETURNING id, poll_again
"""
