"""The watcher's IMAP reading: which untagged responses announce mail, folder names."""

from __future__ import annotations

from mailroom.adapters.imap.watch import FolderNews, decode_folder, encode_folder, parse_news
from mailroom.watcher.account import _is_new_mail

#: A folder name with a non-ASCII letter and quotes, and how it travels (RFC 3501 5.1.3).
FOLDER = 'B\u00fcro "A"'
ON_THE_WIRE = b'"B&APw-ro \\"A\\""'


def test_notify_status_names_the_folder_and_its_uidnext():
    news = parse_news(b'* STATUS "Rechnungen 2026" (MESSAGES 3 UIDNEXT 42 UNSEEN 1)\r\n')
    assert news == FolderNews("Rechnungen 2026", uidnext=42)
    assert parse_news(b"* STATUS INBOX (MESSAGES 0 UIDNEXT 1)\r\n") == FolderNews(
        "INBOX", uidnext=1
    )


def test_idle_counts_are_news_and_keepalives_are_not():
    assert parse_news(b"* 7 EXISTS\r\n") == FolderNews(None, count=7)
    assert parse_news(b"* 1 RECENT\r\n") == FolderNews(None, count=1, recent=True)
    assert parse_news(b"* OK Still here\r\n") is None
    assert parse_news(b"* 3 EXPUNGE\r\n") is None
    assert _is_new_mail([FolderNews(None, count=7)])
    assert not _is_new_mail([FolderNews(None, count=0, recent=True)])


def test_folder_names_travel_in_modified_utf7_and_come_back():
    assert encode_folder(FOLDER) == ON_THE_WIRE
    assert decode_folder(ON_THE_WIRE) == FOLDER
    assert decode_folder(b"{5}\r\nINBOX") == "INBOX"
