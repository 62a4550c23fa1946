"""A failing statement's parameters (mail data, document fields) reach no log line and no event."""

from __future__ import annotations

import io
import json
import logging

import pytest
import sentry_sdk
from pydantic import SecretStr
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from mailroom.db.engine import create_engine
from mailroom.settings import DatabaseSettings, SentrySettings, Settings
from tests.sentry_events import capturing_sentry

pytestmark = pytest.mark.integration

#: Not a secret of the settings: only hiding the parameters keeps it out.
SENTINEL = "Mail-body-sentinel-5581"

logger = logging.getLogger("mailroom.test.hidden_parameters")


async def test_failing_statement_shows_its_sql_but_not_its_parameters(database_url, caplog):
    settings = Settings(
        database=DatabaseSettings(url=database_url),
        sentry=SentrySettings(dsn=SecretStr("https://public@sentry.invalid/1")),
    )
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logging.getLogger().addHandler(handler)
    engine = create_engine(settings.database)
    try:
        with capturing_sentry(settings) as transport:
            with pytest.raises(DBAPIError) as raised:
                async with engine.connect() as conn:
                    await conn.execute(
                        text("INSERT INTO no_such_table (body) VALUES (:body)"), {"body": SENTINEL}
                    )
            try:
                raise raised.value
            except DBAPIError:
                logger.exception("statement failed")  # a log line and, at ERROR, an event
            sentry_sdk.flush()
    finally:
        logging.getLogger().removeHandler(handler)
        await engine.dispose()

    lines = stream.getvalue() + "\n".join(r.getMessage() for r in caplog.records)
    assert "no_such_table" in lines  # the statement is still reported
    assert "hidden" in lines
    assert SENTINEL not in lines
    [event] = transport.events
    assert "no_such_table" in event["exception"]["values"][-1]["value"]
    assert SENTINEL not in json.dumps(transport.events)
