"""The mailbox port: the ``N:*`` quirk, vendor error translation, and the in-memory fake."""

from __future__ import annotations

import imaplib

import pytest
from imapclient.exceptions import LoginError

from mailroom.adapters.imap import filter_uids_above
from mailroom.adapters.imap.client import _translate_errors
from mailroom.adapters.imap.memory import MemoryServer
from mailroom.errors import (
    MailboxCommandFailed,
    MailboxLoginRejected,
    MailboxUnavailable,
    PermanentError,
    RetryableError,
)
from mailroom.intake.batch import bounded_runs
from mailroom.settings import MailboxSettings


def test_uid_search_results_are_filtered_to_uids_above_the_cursor():
    assert filter_uids_above([7], 10) == [], "N:* matched the highest UID, which is below N"
    assert filter_uids_above([13, 11, 12, 11], 10) == [11, 12, 13]


@pytest.mark.parametrize(
    ("error", "expected", "kind"),
    [
        (LoginError("[AUTHENTICATIONFAILED] no"), MailboxLoginRejected, PermanentError),
        (imaplib.IMAP4.abort("socket error: EOF"), MailboxUnavailable, RetryableError),
        (TimeoutError("timed out"), MailboxUnavailable, RetryableError),
        (ConnectionResetError("reset"), MailboxUnavailable, RetryableError),
        (imaplib.IMAP4.error("SELECT failed: NO"), MailboxCommandFailed, RetryableError),
    ],
)
def test_vendor_errors_are_translated_and_keep_their_cause(error, expected, kind):
    with pytest.raises(expected) as caught, _translate_errors("CMD"):
        raise error
    assert isinstance(caught.value, kind)
    assert caught.value.__cause__ is error
    assert str(caught.value).startswith("CMD: ")


def _mailbox() -> MailboxSettings:
    return MailboxSettings(name="m", host="imap.test", username="demouser", password="demopass")


async def test_fake_mailbox_mimics_the_search_quirk_and_fetches_in_uid_order():
    server = MemoryServer()
    server.create_folder("INBOX", uidvalidity=9, first_uid=100)
    for n in range(3):
        server.append("INBOX", b"Subject: %d\r\n\r\n" % n)
    box = server.factory()(_mailbox())
    await box.connect()
    await box.check_health()
    assert await box.select("INBOX") == 9
    assert await box.uids_above(0) == [100, 101, 102]
    assert await box.uids_above(102) == []
    fetched = await box.fetch([102, 100, 55])
    assert [m.uid for m in fetched] == [100, 102]
    assert fetched[0].raw.startswith(b"Subject: 0")
    await box.close()
    assert not box.connected


async def test_fake_mailbox_fails_like_the_real_one():
    server = MemoryServer(password="right")
    box = server.factory()(_mailbox())
    with pytest.raises(MailboxLoginRejected):
        await box.connect()
    server.down = True
    with pytest.raises(MailboxUnavailable):
        await box.connect()


def test_runs_are_bounded_by_count_and_bytes_and_never_empty():
    sizes = {"a": 5, "b": 5, "c": 20, "d": 1, "e": 1, "f": 1}
    runs = bounded_runs(list(sizes), sizes.__getitem__, max_items=2, max_bytes=10)
    assert runs == [["a", "b"], ["c"], ["d", "e"], ["f"]]
    assert bounded_runs([], len, max_items=3, max_bytes=10) == []
    assert bounded_runs(["x", "y"], len, max_items=0, max_bytes=10) == [["x"], ["y"]]
