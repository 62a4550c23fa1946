"""A message given up is one Sentry event at ERROR with its tags, and keeps its reason.

Whatever the error type: permanent (an ``AppError`` in ``throws``, which Sentry's
Dramatiq integration skips), retryable until the attempts run out, or unexpected.
Retries that are part of the plan stay silent.
"""

from __future__ import annotations

import dramatiq
import pytest
from pydantic import SecretStr

from actors.broker.build import build_broker
from actors.middleware.dead_letters import REASON_OPTION, describe
from actors.middleware.retry_policy import RetryPolicy
from mailroom.cli.dead_letters import REASON_OPTION as CLI_REASON_OPTION
from mailroom.errors import PermanentError, RetryableError
from mailroom.settings import BrokerSettings, DatabaseSettings, SentrySettings, Settings
from tests.sentry_events import capturing_sentry

SENTINEL = "Sentinel-Pa55word-4410"
QUEUE = "dead_letter_probe"


@pytest.fixture
def settings():
    return Settings(
        broker=BrokerSettings(kind="stub"),
        database=DatabaseSettings(url=f"postgresql+psycopg://app:{SENTINEL}@db.internal/mailroom"),
        sentry=SentrySettings(dsn=SecretStr("https://public@sentry.invalid/1")),
    )


@pytest.fixture
def sentry(settings):
    with capturing_sentry(settings, process="worker") as transport:
        yield transport


@pytest.fixture
def broker(settings, sentry):
    return build_broker(settings)  # after Sentry: its integration hooks into the broker


def _run(broker, *sends):
    worker = dramatiq.Worker(broker, worker_timeout=50)
    worker.start()
    try:
        for send in sends:
            send()
        broker.join(QUEUE, fail_fast=False)
        worker.join()
    finally:
        worker.stop()


def _dead_letter_events(transport):
    import sentry_sdk

    sentry_sdk.flush()
    return [e for e in transport.events if e.get("tags", {}).get("dead_letter") == "yes"]


def test_permanent_error_is_one_error_event_with_tags_and_the_reason_is_stored(broker, sentry):
    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="deliver_channel_message")
    def deliver(message_id: int) -> None:
        raise PermanentError(f"route rejected; db at postgresql://app:{SENTINEL}@db/x")

    message = deliver.message(4242)
    _run(broker, lambda: broker.enqueue(message))

    [event] = _dead_letter_events(sentry)
    assert event["level"] == "error"
    assert event["exception"]["values"][-1]["type"] == "PermanentError"
    assert event["tags"]["actor"] == "deliver_channel_message"
    assert event["tags"]["queue"] == QUEUE
    assert event["tags"]["message_id"] == message.message_id
    assert event["tags"]["channel_message_id"] == "4242"
    assert event["tags"]["process"] == "worker"
    [letter] = broker.dead_letters_by_queue[QUEUE]
    reason = letter.options[REASON_OPTION]
    assert reason.startswith("PermanentError: route rejected")
    assert SENTINEL not in reason
    assert SENTINEL not in str(sentry.events)


def test_retries_running_out_are_one_error_event_and_the_retries_before_are_silent(broker, sentry):
    attempts = []

    @dramatiq.actor(
        broker=broker,
        queue_name=QUEUE,
        actor_name="map_recognition_result",
        retry_policy=RetryPolicy(base_ms=1, cap_ms=5, jitter=0, max_attempts=3),
    )
    def map_result(job_id: str) -> None:
        attempts.append(job_id)
        raise RetryableError("recognizer busy")

    _run(broker, lambda: map_result.send("job-7"))

    assert len(attempts) == 3
    import sentry_sdk

    sentry_sdk.flush()
    [event] = sentry.events  # the two retries before it reported nothing
    assert event["tags"]["dead_letter"] == "yes"
    assert event["level"] == "error"
    assert event["tags"]["job_id"] == "job-7"
    assert event["contexts"]["dead_letter"]["retries"] == 3
    [letter] = broker.dead_letters_by_queue[QUEUE]
    assert letter.options[REASON_OPTION] == "RetryableError: recognizer busy"


def test_a_retry_that_succeeds_reports_nothing(broker, sentry):
    attempts = []

    @dramatiq.actor(
        broker=broker,
        queue_name=QUEUE,
        actor_name="poll_mailbox",
        retry_policy=RetryPolicy(base_ms=1, cap_ms=5, jitter=0, max_attempts=3),
    )
    def poll(mailbox: str) -> None:
        attempts.append(mailbox)
        if len(attempts) == 1:
            raise RetryableError("imap timeout")

    _run(broker, lambda: poll.send("billing"))

    import sentry_sdk

    sentry_sdk.flush()
    assert len(attempts) == 2
    assert sentry.events == []
    assert broker.dead_letters_by_queue[QUEUE] == []


def test_unexpected_error_on_the_last_attempt_is_one_event_not_two(broker, sentry):
    @dramatiq.actor(
        broker=broker,
        queue_name=QUEUE,
        actor_name="dl_crash",
        retry_policy=RetryPolicy(base_ms=1, cap_ms=5, jitter=0, max_attempts=2),
    )
    def crash() -> None:
        raise RuntimeError("bug")

    _run(broker, crash.send)

    import sentry_sdk

    sentry_sdk.flush()
    # A bug is reported on each attempt; the last one is reported as the dead letter only.
    assert [e["exception"]["values"][-1]["type"] for e in sentry.events] == [
        "RuntimeError",
        "RuntimeError",
    ]
    # Sentry's transport may hand the two events over in either order.
    assert sorted(str(e["tags"].get("dead_letter")) for e in sentry.events) == ["None", "yes"]
    assert all(e["tags"]["actor"] == "dl_crash" for e in sentry.events)


def test_message_too_old_to_run_is_a_dead_letter_event(broker, sentry):
    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="dl_stale", max_age=1)
    def stale() -> None:
        raise AssertionError("a message past its age limit never runs")

    message = stale.message().copy(message_timestamp=0)
    _run(broker, lambda: broker.enqueue(message))

    [event] = _dead_letter_events(sentry)
    assert event["tags"]["actor"] == "dl_stale"
    [letter] = broker.dead_letters_by_queue[QUEUE]
    assert "age limit" in letter.options[REASON_OPTION]


def test_without_sentry_the_reason_is_still_stored(settings):
    broker = build_broker(settings.model_copy(update={"sentry": SentrySettings()}))

    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="dl_quiet")
    def quiet() -> None:
        raise PermanentError()

    _run(broker, quiet.send)
    [letter] = broker.dead_letters_by_queue[QUEUE]
    assert letter.options[REASON_OPTION] == describe(PermanentError())


def test_the_cli_reads_the_option_the_worker_writes():
    assert CLI_REASON_OPTION == REASON_OPTION
