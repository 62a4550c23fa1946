"""Sentry events and log lines never carry secrets or mail bodies; expected errors are not events."""

from __future__ import annotations

import io
import json
import logging

import dramatiq
import pytest
import sentry_sdk
from pydantic import SecretStr

from actors.broker.build import build_broker
from actors.middleware.retry_policy import RetryPolicy
from mailroom.errors import PermanentError, RetryableError
from mailroom.process.observability import SecretScrubber, scrub_text, secret_values
from mailroom.settings import (
    BrokerSettings,
    DatabaseSettings,
    IntakeSettings,
    MailboxSettings,
    SentrySettings,
    Settings,
)
from tests.sentry_events import capturing_sentry

SENTINEL = "Sentinel-Pa55word-7731"
BODY = "Dear customer, the secret mail body"


@pytest.fixture
def settings():
    return Settings(
        broker=BrokerSettings(kind="stub"),
        database=DatabaseSettings(url=f"postgresql+psycopg://app:{SENTINEL}@db.internal/mailroom"),
        intake=IntakeSettings(
            mailboxes=[
                MailboxSettings(
                    name="m", host="imap.test", username="u", password=SecretStr(SENTINEL)
                )
            ]
        ),
        sentry=SentrySettings(dsn=SecretStr("https://public@sentry.invalid/1")),
    )


@pytest.fixture
def transport(settings):
    with capturing_sentry(settings) as transport:
        yield transport


def test_secret_values_are_found_in_nested_settings(settings):
    assert SENTINEL in secret_values(settings)


def test_url_passwords_are_removed_from_text():
    text = f"could not connect to postgresql://app:{SENTINEL}@db:5432/x and redis://:{SENTINEL}@r/0"
    assert SENTINEL not in scrub_text(text, [])


def test_each_given_up_message_is_one_scrubbed_event_with_its_tags(settings, transport):
    broker = build_broker(settings)  # built after Sentry: the integration hooks in

    @dramatiq.actor(
        broker=broker,
        queue_name="sentry_probe",
        actor_name="sentry_crash",
        retry_policy=RetryPolicy(max_attempts=1),
    )
    def crash(body: str) -> None:
        raise RuntimeError(f"failed talking to postgresql://app:{SENTINEL}@db.internal/mailroom")

    @dramatiq.actor(
        broker=broker,
        queue_name="sentry_probe",
        actor_name="poll_mailbox",
        retry_policy=RetryPolicy(max_attempts=1),
    )
    def poll(mailbox: str) -> None:
        raise RuntimeError("imap went away")

    @dramatiq.actor(broker=broker, queue_name="sentry_probe", actor_name="sentry_expected")
    def expected(kind: str) -> None:
        raise PermanentError("bad payload") if kind == "permanent" else RetryableError("later")

    worker = dramatiq.Worker(broker, worker_timeout=50)
    worker.start()
    try:
        crash.send(BODY)
        poll.send("billing")
        expected.send("permanent")
        broker.join("sentry_probe", fail_fast=False)
        worker.join()
    finally:
        worker.stop()
    sentry_sdk.flush()

    errors = [e for e in transport.events if e.get("level") == "error" and e.get("exception")]
    kinds = [e["exception"]["values"][-1]["type"] for e in errors]
    assert "RuntimeError" in kinds
    assert sorted(kinds) == ["PermanentError", "RuntimeError", "RuntimeError"]
    crash_event = next(e for e in errors if e["tags"].get("actor") == "sentry_crash")
    assert crash_event["exception"]["values"][-1]["type"] == "RuntimeError"
    assert crash_event["tags"]["queue"] == "sentry_probe"
    assert "message_id" in crash_event["tags"]
    poll_event = next(e for e in errors if e["tags"].get("actor") == "poll_mailbox")
    assert poll_event["tags"]["mailbox"] == "billing"
    dumped = json.dumps(transport.events)
    assert SENTINEL not in dumped
    assert BODY not in dumped


def test_log_lines_never_show_the_sentinel(settings):
    scrubber = SecretScrubber(secret_values(settings))
    logger = logging.getLogger("mailroom.test")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(scrubber)
    logger.addHandler(handler)
    try:
        logger.warning("connect failed: %s", f"imap login as demo with {SENTINEL}")
        logger.error(
            "Failed to process message %s.",
            dramatiq.Message(
                queue_name="q", actor_name="deliver", args=(BODY,), kwargs={}, options={}
            ),
        )
        try:
            raise ConnectionError(f"postgresql://app:{SENTINEL}@db/x refused")
        except ConnectionError:
            logger.exception("database down")
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert "connect failed" in text and "database down" in text
    assert SENTINEL not in text
    assert BODY not in text
    assert "deliver[" in text


def test_scheduler_jobs_check_in_with_their_cron_monitor(settings, transport):
    from scheduling.jobs import PeriodicJob
    from scheduling.runner import _run_job

    sent = []
    _run_job(PeriodicJob("deadline_watchdog", 30, lambda: sent.append(1)))

    def broken() -> None:
        raise ConnectionError("broker down")

    _run_job(PeriodicJob("poll_mailbox:billing", 120, broken))
    sentry_sdk.flush()
    assert sent == [1]
    by_slug = {c["monitor_slug"]: c for c in transport.check_ins}
    assert by_slug["deadline-watchdog"]["status"] == "ok"
    assert by_slug["poll-mailbox-billing"]["status"] == "error"
    assert by_slug["poll-mailbox-billing"]["monitor_config"]["schedule"]["value"] == 2
