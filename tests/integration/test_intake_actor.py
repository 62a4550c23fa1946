"""``poll_mailbox`` on the StubBroker: wired from resources, nudges the outbox, re-sends itself."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest
import redis.asyncio as aioredis
from dramatiq import Message

import actors.intake
import actors.middleware.resources
from actors.intake import poll_mailbox
from mailroom.config_store import effective
from mailroom.recognition.outbox import window
from mailroom.settings import (
    DatabaseSettings,
    IntakeSettings,
    RedisSettings,
    Settings,
    StorageSettings,
)
from tests.fixtures.imap import csv_mail, make_mail

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(database_url, redis_url, tmp_path, imap_server, imap_folder):
    mailbox = imap_server.mailbox_settings("box", imap_folder, batch_size=2)
    settings = Settings(
        state_dir=tmp_path,
        database=DatabaseSettings(url=database_url, pool_size=2),
        redis=RedisSettings(url=redis_url),
        storage=StorageSettings(kind="filesystem"),
        intake=IntakeSettings(mailboxes=[mailbox]),
    )
    actors.middleware.resources.configure(settings)
    return settings


def _query(settings, sql, *params):
    dsn = settings.database.url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def test_poll_stores_mail_nudges_the_publisher_and_polls_again_while_mail_waits(
    settings, stub_broker, intake_worker, imap_server, imap_folder
):
    uids = imap_server.append(imap_folder, *(csv_mail(n) for n in range(3)))

    poll_mailbox.send("box")
    stub_broker.join("intake", fail_fast=True)
    intake_worker.join()

    stored = _query(settings, "SELECT uid FROM inbound_mail WHERE status = 'stored' ORDER BY uid")
    assert [uid for (uid,) in stored] == uids, "a full batch of 2 re-sent the poll for the third"
    # Both polls nudged; the pass the first one queued has not started, so it serves the second.
    assert stub_broker.queues["outbox"].qsize() == 1
    assert stub_broker.dead_letters == []


def test_a_nudge_after_the_pass_started_queues_the_next_pass(
    settings, redis_url, stub_broker, intake_worker, imap_server, imap_folder
):
    imap_server.append(imap_folder, csv_mail(0))
    poll_mailbox.send("box")
    stub_broker.join("intake", fail_fast=True)
    intake_worker.join()

    async def pass_starts() -> None:
        redis = aioredis.Redis.from_url(redis_url)
        try:
            await window.pass_started(redis, settings.nats)
        finally:
            await redis.aclose()

    asyncio.run(pass_starts())
    imap_server.append(imap_folder, csv_mail(1))
    poll_mailbox.send("box")
    stub_broker.join("intake", fail_fast=True)
    intake_worker.join()

    assert _query(settings, "SELECT count(*) FROM inbound_mail") == [(2,)]
    # The jobs committed after the first pass started (and read) need a pass of their own.
    assert stub_broker.queues["outbox"].qsize() == 2


def test_only_a_mail_with_nothing_to_recognize_asks_for_a_notification_pass(
    settings, stub_broker, intake_worker, imap_server, imap_folder
):
    # Mails with jobs: their finishers ask for the pass once the jobs end, not the poll.
    imap_server.append(imap_folder, csv_mail(0), csv_mail(1))
    poll_mailbox.send("box")
    stub_broker.join("intake", fail_fast=True)
    intake_worker.join()
    assert stub_broker.queues["mapping"].qsize() == 0

    # A mail without attachments is final once stored: its pass is asked for at once.
    imap_server.append(imap_folder, make_mail(2))
    poll_mailbox.send("box")
    stub_broker.join("intake", fail_fast=True)
    intake_worker.join()
    assert _query(settings, "SELECT count(*) FROM inbound_mail") == [(3,)]
    passes = stub_broker.queues["mapping"]
    assert passes.qsize() == 1
    assert Message.decode(passes.get()).actor_name == "notify_final_mails"
    assert stub_broker.dead_letters == []


def test_the_mailboxes_are_read_once_while_their_rows_do_not_change(
    settings, stub_broker, intake_worker, imap_server, imap_folder, monkeypatch
):
    reads: list[str] = []
    kept = actors.intake._MAILBOXES

    async def counted(*args):
        reads.append("mailboxes")
        return await effective.intake_settings(*args)

    monkeypatch.setattr(kept, "load", counted)
    imap_server.append(imap_folder, *(csv_mail(n) for n in range(3)))

    poll_mailbox.send("box")
    stub_broker.join("intake", fail_fast=True)
    intake_worker.join()

    assert _query(settings, "SELECT count(*) FROM inbound_mail") == [(3,)], "two polls ran"
    assert reads == ["mailboxes"], "the second poll kept what the first read"


def test_unknown_mailbox_fails_permanently(settings, stub_broker, intake_worker):
    poll_mailbox.send("nope")
    stub_broker.join("intake", fail_fast=False)
    intake_worker.join()
    assert len(stub_broker.dead_letters) == 1


def test_lost_lease_returns_normally_and_the_worker_takes_the_next_poll(
    settings, stub_broker, intake_worker, imap_server, imap_folder
):
    settings.intake.lease_s = 0.6
    # A mail that Postgres takes its time to store: the poll is still at it when robbed.
    _query(
        settings,
        "CREATE FUNCTION slow_mail() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN IF NEW.subject = 'SLOW' THEN PERFORM pg_sleep(3); END IF; RETURN NEW; END $$",
    )
    _query(
        settings,
        "CREATE TRIGGER slow_mail BEFORE INSERT ON inbound_mail "
        "FOR EACH ROW EXECUTE FUNCTION slow_mail()",
    )
    imap_server.append(imap_folder, make_mail(9, subject="SLOW"))

    def steal() -> None:
        time.sleep(0.3)  # the poll is storing the slow mail by now
        _query(settings, "UPDATE mailbox_cursor SET lease_id = gen_random_uuid()")

    thief = threading.Thread(target=steal)
    thief.start()
    started = time.monotonic()
    poll_mailbox.send("box")
    stub_broker.join("intake", fail_fast=True)
    intake_worker.join()
    thief.join()
    assert time.monotonic() - started < 10, "the heartbeat cut the batch short"
    assert stub_broker.dead_letters == []

    # The next poll reads the folder again, from the start.
    _query(settings, "DROP TRIGGER slow_mail ON inbound_mail")
    (uid,) = imap_server.append(imap_folder, csv_mail(1))
    time.sleep(0.7)  # the thief's lease runs out
    poll_mailbox.send("box")
    stub_broker.join("intake", fail_fast=True)
    intake_worker.join()
    assert (uid, "stored") in _query(settings, "SELECT uid, status FROM inbound_mail")
