"""Kept IMAP connections (``mailroom.intake.connections``) under real polls on pymap and Postgres.

Polls of two folders of one account log in once; a connection the server dropped meanwhile
is replaced without a failed poll; one whose batch failed is closed, not kept.
"""

from __future__ import annotations

import pytest

from mailroom.adapters.imap import ImapMailbox
from mailroom.intake.connections import ConnectionPool, account_key
from mailroom.settings import MailboxSettings
from tests.fixtures.imap import csv_mail, new_folder

pytestmark = pytest.mark.integration


class CountingPool(ConnectionPool):
    """A pool that remembers every connection it opened."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[ImapMailbox] = []

    def open(self, settings: MailboxSettings) -> ImapMailbox:
        mailbox = ImapMailbox(settings)
        self.opened.append(mailbox)
        return mailbox


@pytest.fixture
async def pool():
    pool = CountingPool()
    yield pool
    await pool.aclose()


async def test_polls_of_one_account_log_in_once_and_read_each_folder_in_order(
    intake_env, mail_server, pool
):
    other = new_folder(mail_server)
    intake_env.settings.intake.mailboxes.append(mail_server.mailbox_settings("other", other))
    box_uids = intake_env.append(csv_mail(1), csv_mail(2))
    other_uids = mail_server.append(other, csv_mail(3))

    assert (await intake_env.poll("box", connect=pool)).status == "done"
    assert (await intake_env.poll("other", connect=pool)).status == "done"
    assert (await intake_env.poll("box", connect=pool)).status == "done"

    assert len(pool.opened) == 1, "one login served both folders and the second pass"
    by_cursor = {}
    for mail in await intake_env.mails():
        by_cursor.setdefault(mail.cursor_id, []).append(mail.uid)
    assert sorted(by_cursor.values()) == sorted([box_uids, other_uids])

    await pool.aclose()  # the worker stops: kept connections log out, a late give-back too
    assert [m._client for m in pool.opened] == [None]
    assert (await intake_env.poll("box", connect=pool)).status == "done"
    assert [m._client for m in pool.opened] == [None, None]


async def test_a_kept_connection_the_server_dropped_is_replaced_without_a_failed_poll(
    intake_env, pool
):
    assert (await intake_env.poll("box", connect=pool)).status == "done"
    (kept,) = pool.opened
    assert kept._client is not None
    kept._client.shutdown()  # the server's autologout, a restart, a NAT timeout
    (uid,) = intake_env.append(csv_mail(1))

    outcome = await intake_env.poll("box", connect=pool)

    assert outcome.status == "done", outcome.reason
    assert [m.uid for m in await intake_env.mails()] == [uid]
    assert len(pool.opened) == 2
    assert (await intake_env.cursor()).retry_count == 0


async def test_a_connection_whose_batch_failed_is_closed_not_kept(intake_env, mail_server, pool):
    intake_env.settings.intake.mailboxes.append(
        mail_server.mailbox_settings("gone", "no-such-folder")
    )
    assert (await intake_env.poll("gone", connect=pool)).status == "batch_failed"
    assert pool.take(account_key(intake_env.settings.intake.mailboxes[0])) is None

    assert (await intake_env.poll("box", connect=pool)).status == "done"
    assert len(pool.opened) == 2, "the failed poll's connection was not reused"
