"""The mail statement runs on its generic plan (``GENERIC_PLANS``): that plan must keep to keys.

A generic plan cannot see the values, so a predicate a partial index needs as a constant, or
one whose selectivity depends on the value, would turn into a scan of every mail ever stored.
"""

from __future__ import annotations

import re
import uuid

import pytest
from sqlalchemy import text

from mailroom.db.engine import autocommit, psycopg_autocommit
from mailroom.intake.mail_sql import (
    STORE_MAIL_WITH_ID,
    STORE_MAIL_WITHOUT_ID,
    MailWrite,
    store_mails,
)
from tests.fixtures.plans import plan_nodes

pytestmark = pytest.mark.integration

#: The tables the statement reads or writes that grow with every mail (mailbox_cursor has a
#: row per mailbox: a few pages, which Postgres rightly reads whole).
GROWING = {"inbound_mail", "stored_object", "stored_file", "recognition_job", "erased_mail"}


def _numbered(statement: str) -> str:
    """``statement`` with its named placeholders as ``$n``, as EXPLAIN (GENERIC_PLAN) takes it."""
    names: dict[str, int] = {}
    return re.sub(
        r"%\((\w+)\)s", lambda m: f"${names.setdefault(m.group(1), len(names) + 1)}", statement
    )


@pytest.mark.parametrize("statement", [STORE_MAIL_WITH_ID, STORE_MAIL_WITHOUT_ID])
async def test_the_generic_plan_of_a_mails_statement_finds_rows_by_key(db_sessions, statement):
    # A history of 20,000 mails over 200 mailboxes, with their objects, and statistics taken
    async with autocommit(db_sessions) as connection:
        await connection.execute(
            text(
                "INSERT INTO mailbox_cursor (mailbox, folder) "
                "SELECT 'box' || n, 'INBOX' FROM generate_series(1, 200) AS n"
            )
        )
        await connection.execute(
            text(
                "INSERT INTO stored_object (bucket_role, bucket, key, size, sha256, media_type, "
                "created_by) SELECT 'mail', 'mail', 'mail/' || n, 1, md5(n::text), "
                "'message/rfc822', 'test' "
                "FROM generate_series(1, 20000) AS n"
            )
        )
        await connection.execute(
            text(
                "INSERT INTO inbound_mail (cursor_id, uidvalidity, uid, message_id, "
                "content_sha256, subject, status, raw_object_id) "
                "SELECT c.id, 1, n, '<' || n || '@example.org>', md5(n::text), 'old', 'final', o.id "
                "FROM generate_series(1, 20000) AS n "
                "JOIN mailbox_cursor AS c ON c.mailbox = 'box' || (1 + n % 200) "
                "JOIN stored_object AS o ON o.key = 'mail/' || n"
            )
        )
        await connection.execute(
            text(
                "INSERT INTO erased_mail (content_sha256, message_id_sha256) "
                "SELECT md5((-n)::text), md5(n::text) FROM generate_series(1, 20000) AS n"
            )
        )
        for table in (*GROWING, "mailbox_cursor"):
            await connection.execute(text(f"ANALYZE {table}"))
        [plan] = (
            await connection.exec_driver_sql(
                "EXPLAIN (GENERIC_PLAN, FORMAT JSON) " + _numbered(statement)
            )
        ).scalar_one()

    # Then its plan reads none of them whole: each row is found through an index
    scans = [(node["Node Type"], node.get("Relation Name")) for node in plan_nodes(plan["Plan"])]
    assert any("Index" in node for node, _ in scans), scans
    assert not [(node, table) for node, table in scans if node == "Seq Scan" and table in GROWING]


def _write(cursor_id: int, lease_id: uuid.UUID, uid: int) -> MailWrite:
    return MailWrite(
        cursor_id=cursor_id,
        lease_id=lease_id,
        uidvalidity=1,
        uid=uid,
        mail={
            "message_id": f"<{uid}@example.org>",
            "message_id_sha256": None,
            "erased": False,
            "sha256": f"{uid:064x}",
            "sender": "a@example.org",
            "sender_name": None,
            "return_path": None,
            "authentication_results": None,
            "subject": "plans",
            "internal_date": None,
            "problem": None,
        },
        raw=None,
        objects=[],
        files=[],
        created_by="test",
    )


async def test_a_connection_stores_mails_on_the_generic_plan_from_the_first(db_sessions):
    # A cursor under a lease, on the batch's psycopg connection
    lease_id = uuid.uuid4()
    async with autocommit(db_sessions) as connection:
        cursor_id = (
            await connection.execute(
                text(
                    "INSERT INTO mailbox_cursor (mailbox, folder, lease_id) "
                    "VALUES ('plans', 'INBOX', :lease) RETURNING id"
                ),
                {"lease": lease_id},
            )
        ).scalar_one()
    async with psycopg_autocommit(db_sessions) as pg:
        # When mails are stored in groups and one by one (a group of one)
        for uids in ([1, 2, 3], [4], [5, 6], [7]):
            results, error = await store_mails(pg, [_write(cursor_id, lease_id, u) for u in uids])
            assert error is None and all(r.fenced and r.mail_id for r in results)
        plans = await (
            await pg.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE 'WITH fence%'"
            )
        ).fetchall()

    # Then every mail ran on the statement's generic plan (made once for the connection): at
    # Postgres's default the first five would have been planned each for its own values
    assert plans == [(7, 0)]
