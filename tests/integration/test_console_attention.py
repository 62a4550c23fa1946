"""The console's "needs a person" page and a mail's story on the real Postgres and Redis:
each cause with its action, a confirmation first, audited with the operator's id."""

from __future__ import annotations

import re

import pytest
from dramatiq import Message
from dramatiq.brokers.redis import RedisBroker
from starlette.testclient import TestClient

from mailroom.settings import RedisSettings
from tests.fixtures.console import console_settings_for, sign_in

pytestmark = pytest.mark.integration


@pytest.fixture
def console_settings(database_url, redis_url, tmp_path):
    settings = console_settings_for(database_url, tmp_path)
    return settings.model_copy(update={"redis": RedisSettings(url=redis_url)})


@pytest.fixture
def recognition_settings(console_settings):
    return console_settings


def hidden(html: str, action: str) -> dict[str, str]:
    """The fields of the first form posting to ``action``."""
    form = re.search(
        rf'<form method="post" action="{re.escape(action)}"[^>]*>(.*?)</form>', html, re.S
    )
    assert form, f"no form for {action}"
    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form.group(1)))


def confirm(client: TestClient, action: str) -> str:
    """Press the action's button on the page, then "Yes" on the confirmation; the page after."""
    asked = client.post(action, data=hidden(client.get("/attention").text, action))
    assert asked.status_code == 200 and "Yes, do it" in asked.text
    done = client.post(action, data=hidden(asked.text, action))
    assert done.url.path == "/attention"
    return done.text


async def test_a_blocked_mailbox_is_listed_and_unblocked_after_a_confirmation(
    console, recognition_factory
):
    await recognition_factory.rows(
        "INSERT INTO mailbox_cursor (mailbox, folder, status, blocked_reason, last_error) "
        "VALUES ('billing', 'INBOX', 'blocked', 'LOGIN_REFUSED', '<b>login</b> refused') "
        "RETURNING id"
    )
    sign_in(console, "olga")
    page = console.get("/attention").text
    assert "mailboxes refused" in page and "LOGIN_REFUSED" in page
    assert "&lt;b&gt;login&lt;/b&gt; refused" in page

    after = confirm(console, "/attention/unblock")

    assert "unblocked billing/INBOX" in after
    [cursor] = await recognition_factory.rows("SELECT status FROM mailbox_cursor")
    assert cursor["status"] == "idle"
    [event] = await recognition_factory.rows(
        "SELECT actor_id FROM audit_event WHERE action LIKE 'intake.%'"
    )
    assert event["actor_id"] == "olga"


async def test_a_stopped_recognition_job_is_replayed_and_the_publisher_nudged(
    console, recognition_factory, nudges
):
    ref = await recognition_factory.create_job(
        status="error", file_status="ERROR", error_code="INVALID_RESULT"
    )
    sign_in(console, "olga")

    after = confirm(console, "/attention/replay-job")

    assert f"file {ref.file_id}: attempt 2 queued by olga" in after
    jobs = await recognition_factory.jobs_of_file(ref.file_id)
    assert [(j["attempt"], j["status"]) for j in jobs] == [(1, "error"), (2, "queued")]
    assert nudges.sent == ["publish"]


async def test_a_failed_notification_is_sent_again(console, recognition_factory):
    [row] = await recognition_factory.rows(
        "INSERT INTO channel_message (channel, recipient, body, status, attempts, last_error) "
        "VALUES ('log', 'ops', 'text', 'failed', 3, 'boom') RETURNING id"
    )
    sign_in(console, "olga")

    after = confirm(console, "/attention/replay-message")

    assert f"message {row['id']} queued again by olga" in after
    [message] = await recognition_factory.rows("SELECT status FROM channel_message")
    assert message["status"] == "pending"


async def test_a_dead_letter_is_replayed_and_audited(
    console, console_settings, recognition_factory
):
    broker = RedisBroker(
        url=console_settings.redis.url, namespace=console_settings.broker.namespace
    )
    try:
        broker.declare_queue("delivery")
        sent = broker.enqueue(
            Message(
                queue_name="delivery",
                actor_name="deliver_channel_message",
                args=(1,),
                kwargs={},
                options={"dead_letter_reason": "boom"},
            )
        )
        assert len(broker.do_fetch("delivery", 1)) == 1
        broker.do_nack("delivery", sent.options["redis_message_id"])
        sign_in(console, "olga")
        assert sent.message_id in console.get("/attention").text

        after = confirm(console, "/attention/replay-dead-letter")

        assert f"dead letter {sent.message_id} sent to deliver_channel_message again" in after
        assert broker.client.llen(f"{console_settings.broker.namespace}:delivery") == 1
    finally:
        broker.client.close()
    [event] = await recognition_factory.rows(
        "SELECT actor_id, detail FROM audit_event WHERE action = 'dramatiq.dead_letters_replayed'"
    )
    assert event["actor_id"] == "olga" and event["detail"]["count"] == 1


async def test_a_viewer_sees_what_needs_a_person_without_actions(console, recognition_factory):
    await recognition_factory.create_job(status="dlq", file_status="ERROR", error_code="NO_ACK")
    sign_in(console, "vera", "viewer")
    page = console.get("/attention").text
    assert "NO_ACK" in page and "/attention/replay-job" not in page


async def test_a_mail_story_is_found_by_message_id_sender_or_id(
    console, review_seed, recognition_factory
):
    ref = await review_seed.document(
        fields={"amount": (500, 0.99)}, sender="story@fund.example", subject="<i>Q3</i> notice"
    )
    [mail] = await recognition_factory.rows(
        "SELECT message_id FROM inbound_mail WHERE id = :id", {"id": ref.mail_id}
    )
    await recognition_factory.rows(
        "INSERT INTO channel_message (channel, recipient, body, status, mail_id) "
        "VALUES ('webhook', 'https://erp.example/in', 'x', 'delivered', :mail) RETURNING id",
        {"mail": ref.mail_id},
    )
    sign_in(console)

    for query in (
        mail["message_id"],
        mail["message_id"].strip("<>"),
        "STORY@fund",
        str(ref.mail_id),
    ):
        page = console.get("/search", params={"q": query})
        assert page.url.path == f"/mails/{ref.mail_id}", query

    story = console.get(f"/mails/{ref.mail_id}").text
    assert "&lt;i&gt;Q3&lt;/i&gt; notice" in story
    assert "notice.csv" in story and "NEEDS_CHECK" in story
    assert "reader" in story and "missing investor_name|customer_id" in story
    assert "https://erp.example/in" in story and "delivered" in story
    assert "No mail has that id" in console.get("/search", params={"q": "nobody"}).text


async def test_an_uncertain_notification_is_resolved_as_delivered(console, recognition_factory):
    [row] = await recognition_factory.rows(
        "INSERT INTO channel_message (channel, recipient, body, status, attempts) "
        "VALUES ('email', 'ops@bank.example', 'text', 'uncertain', 1) RETURNING id"
    )
    sign_in(console, "olga")

    after = confirm(console, "/attention/resolve-message")

    assert f"message {row['id']} resolved as delivered by olga" in after
    [message] = await recognition_factory.rows("SELECT status, delivered_at FROM channel_message")
    assert message["status"] == "delivered" and message["delivered_at"] is not None
    [event] = await recognition_factory.rows(
        "SELECT actor_id, detail FROM audit_event WHERE action = 'delivery.resolved'"
    )
    assert event == {
        "actor_id": "olga",
        "detail": {"previous_status": "uncertain", "outcome": "delivered"},
    }
