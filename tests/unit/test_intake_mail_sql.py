"""The statement that stores a mail stays cheap for the client to send."""

from __future__ import annotations

import pytest
from psycopg import _queries

from mailroom.intake.mail_sql import STORE_MAIL_WITH_ID, STORE_MAIL_WITHOUT_ID


@pytest.mark.parametrize("statement", [STORE_MAIL_WITH_ID, STORE_MAIL_WITHOUT_ID])
def test_the_store_statement_is_short_enough_for_psycopg_to_parse_it_once(statement):
    # Longer, and psycopg parses its placeholders again for every mail of every group.
    assert len(statement.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH
    assert "-- Ids drawn first" in statement  # comments keep their own line
