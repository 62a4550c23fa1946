"""An IDLE that loses step with the server reconnects and reports a change instead of failing."""

from __future__ import annotations

import imaplib

import pytest
from imapclient import IMAPClient

from mailroom.adapters.imap import ImapMailbox
from tests.fixtures.imap import csv_mail, on_every_server

pytestmark = pytest.mark.integration


@on_every_server
async def test_idle_that_the_server_answers_out_of_step_reconnects_and_fetches(
    mail_server, mail_folder, monkeypatch
):
    mailbox = ImapMailbox(mail_server.mailbox_settings("box", mail_folder, idle=True))
    original_idle = IMAPClient.idle
    calls = []
    uids = []

    def out_of_step(self):
        calls.append(self)
        if len(calls) == 1:
            # Mail lands as IDLE starts, and the server's answer comes out of step.
            uids.extend(mail_server.append(mail_folder, csv_mail(1)))
            raise imaplib.IMAP4.abort("unexpected response: b'FLAGS (\\\\Recent))'")
        return original_idle(self)

    monkeypatch.setattr(IMAPClient, "idle", out_of_step)
    try:
        await mailbox.connect()
        await mailbox.select(mail_folder)

        assert await mailbox.idle(5.0) is True
        # The fresh connection has the folder selected and sees the new mail.
        assert await mailbox.uids_above(0) == uids
        assert not await mailbox.idle(0.2)  # and IDLE works again on it
    finally:
        await mailbox.close()
    assert len(calls) == 2
