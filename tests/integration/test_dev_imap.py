"""The dev IMAP server keeps its mailbox across restarts when it has a data folder."""

from __future__ import annotations

from pathlib import Path

from mailroom.devtools.dev import _start_imap
from mailroom.devtools.imap import ImapServer
from mailroom.devtools.seed import sample_mails
from mailroom.devtools.stack import free_port
from mailroom.settings import IntakeSettings, MailboxSettings, Settings


def test_a_restarted_server_keeps_uidvalidity_uids_and_mail(tmp_path: Path) -> None:
    data = tmp_path / "imap"
    server = ImapServer(data_dir=data).start()
    try:
        server.add_user("demouser", "demopass")
        first_uids = server.append(
            "INBOX", b"Subject: one\r\n\r\n1\r\n", b"Subject: two\r\n\r\n2\r\n"
        )
        uidvalidity = server.uidvalidity("INBOX")
    finally:
        server.stop()

    server = ImapServer(data_dir=data).start()
    try:
        assert server.uidvalidity("INBOX") == uidvalidity
        assert server.uids("INBOX") == first_uids
        # New mail continues above the old UIDs instead of reusing them.
        [third] = server.append("INBOX", b"Subject: three\r\n\r\n3\r\n")
        assert third > max(first_uids)
    finally:
        server.stop()


def _dev_settings(state_dir: Path, port: int) -> Settings:
    mailbox = MailboxSettings(
        name="dev",
        host="127.0.0.1",
        port=port,
        security="plain",
        username="demouser",
        password="demopass",
        folder="INBOX",
    )
    return Settings(state_dir=state_dir, intake=IntakeSettings(mailboxes=[mailbox]))


def test_mailroom_dev_seeds_the_samples_once_per_state_dir(tmp_path: Path) -> None:
    settings = _dev_settings(tmp_path / "state", free_port())
    seen = []
    for _ in range(2):
        server = _start_imap(settings, seed=True)
        assert server is not None
        try:
            seen.append((server.uidvalidity("INBOX"), server.uids("INBOX")))
        finally:
            server.stop()
    (uidvalidity, uids), (again_uidvalidity, again_uids) = seen
    assert len(uids) == len(sample_mails())
    assert (again_uidvalidity, again_uids) == (uidvalidity, uids)
