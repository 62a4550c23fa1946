"""SQL on ``channel_message`` shared by delivery, stale recovery and replay."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, cast

from sqlalchemy import Float, Table, bindparam, func, update

from mailroom.db.models import AuditEvent, ChannelMessage

#: What the message says when a send may or may not have reached the recipient.
UNCERTAIN_ERROR = "delivery outcome unknown; verify with the recipient before retrying"

# CLAIM, STATUSES and SUCCEED are in psycopg's paramstyle: the shared round trips of the
# deliverer (``mailroom.delivery.batch.Rounds``) run them on the driver's connection, as
# SQLAlchemy's execute cost more CPU than the statement.

#: Claim many in one statement: count each attempt, mark it sending, return the status before.
#: It returns the fields of ``mailroom.delivery.batch.Claim`` in their order.
#: Rows not returned are missing, final, or not due yet. Row locks are taken in id order.
#: Times are the database's (``mailroom/db/clock.py``); ``due_slack_s`` lets a retry come early.
#: The rows are found by primary key and locked first (a materialized CTE, so no condition
#: is pushed into it), then checked as locked (their latest version): the plan cannot follow
#: the statistics. With the conditions on the update's side, a table whose statistics still
#: counted few open rows (a burst of new messages, not analyzed yet) was planned from the
#: open-message index, re-running the locking subquery once per open row (20-50 ms for a
#: claim of 50 among 4,000 open; 0.5 ms by primary key).
#: A message's empty chunk record (every first attempt's) comes back as NULL: the driver
#: parses no JSON for it.
_CLAIM_LOCKED = """
    prev AS MATERIALIZED (
        SELECT id, status, next_retry_at FROM channel_message
         WHERE id = ANY(CAST(%(ids)s AS bigint[])) ORDER BY id FOR UPDATE)"""
_CLAIM_UPDATE = """
    UPDATE channel_message AS m
       SET attempts = m.attempts + 1, status = 'sending', sending_since = now()
      FROM prev
     WHERE m.id = ANY(CAST(%(ids)s AS bigint[]))
       AND m.id = prev.id
       AND prev.status IN ('pending', 'sending')
       AND (prev.next_retry_at IS NULL
            OR prev.next_retry_at <= now() + make_interval(secs => CAST(%(due_slack_s)s AS float8)))
    RETURNING m.id, m.channel, m.account, m.recipient, m.subject, m.body, m.attempts,
              NULLIF(m.chunks, '{}'::jsonb) AS chunks, m.last_error, prev.status AS previous_status"""
CLAIM = f"WITH {_CLAIM_LOCKED} {_CLAIM_UPDATE}"

#: The status of each of ``ids`` that exists (to tell missing, final and not-due apart).
STATUSES = "SELECT id, status FROM channel_message WHERE id = ANY(CAST(%(ids)s AS bigint[]))"

#: Settle many deliveries in one statement, each fenced on its attempt like ``fenced_update``.
#: ``rows`` is a JSON array of ``{"id", "attempts", "chunks"}``; returns the ids it settled.
SUCCEED = """
    UPDATE channel_message AS m
       SET status = 'delivered', delivered_at = now(), chunks = v.chunks,
           last_error = NULL, next_retry_at = NULL
      FROM json_to_recordset(CAST(%(rows)s AS json)) AS v(id bigint, attempts integer, chunks jsonb)
     WHERE m.id = v.id AND m.attempts = v.attempts AND m.status = 'sending'
    RETURNING m.id
    """

#: SUCCEED and CLAIM in one statement (one transaction, one commit to wait for): the lanes'
#: settlements and the claims of the messages they take next. Rows are CLAIM's with
#: ``claimed`` first (true), then one row per settled id (false, the id, the rest NULL).
#: No message is in both: a message is in one lane of a process (``LockOwner``).
SUCCEED_AND_CLAIM = f"""
    WITH settled AS ({SUCCEED}),
    {_CLAIM_LOCKED},
    claimed AS ({_CLAIM_UPDATE})
    SELECT true AS claimed, * FROM claimed
    UNION ALL
    SELECT false, id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM settled
    """


@lru_cache(maxsize=32)
def fenced_update(columns: frozenset[str]) -> Any:
    """UPDATE of ``columns`` that only hits the row while it is still one attempt's.

    Bind ``fence_id`` and ``fence_attempts`` plus one parameter per column (or
    ``RETRY_IN_S``: ``next_retry_at`` that many seconds after the database's now()); the
    statement returns the id, so no row back means a later attempt took over.
    """
    table = cast(Table, ChannelMessage.__table__)
    return (
        update(table)
        .where(
            table.c.id == bindparam("fence_id"),
            table.c.attempts == bindparam("fence_attempts"),
            table.c.status == "sending",
        )
        .values(
            {
                ("next_retry_at" if name == RETRY_IN_S else name): (
                    _RETRY_AT if name == RETRY_IN_S else bindparam(name, type_=table.c[name].type)
                )
                for name in sorted(columns)
            }
        )
        .returning(table.c.id)
    )


#: The pseudo-column of ``fenced_update`` that sets ``next_retry_at`` this many seconds after
#: the database's now().
RETRY_IN_S = "retry_in_s"
_RETRY_AT = func.now() + func.make_interval(0, 0, 0, 0, 0, 0, bindparam("retry_in_s", type_=Float))


def stale_recovered_event(message_ids: list[int], *, found_by: str, resent: int = 0) -> AuditEvent:
    """The one audit event of a recovery: how many messages ended uncertain (and re-sent)."""
    return AuditEvent(
        actor_type="system",
        actor_id=found_by,
        action="delivery.stale_recovered",
        target="channel_message",
        detail={
            "count": len(message_ids),
            "message_ids": message_ids,
            "resent": resent,
            "reason": UNCERTAIN_ERROR,
        },
    )
