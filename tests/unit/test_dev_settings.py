"""``mailroom dev`` supplies the mailbox and plain IMAP the product does not default to."""

from __future__ import annotations

import json

from mailroom.devtools.dev import dev_mailboxes
from mailroom.devtools.imap import DEMO_PASSWORD, DEMO_USER
from mailroom.settings import IntakeSettings


def test_dev_serves_one_demo_mailbox_when_none_is_configured():
    (mailbox,) = IntakeSettings(mailboxes=json.loads(dev_mailboxes(None, imap_port=1143))).mailboxes
    assert (mailbox.name, mailbox.host, mailbox.port) == ("dev", "127.0.0.1", 1143)
    assert mailbox.security == "plain"
    assert (mailbox.username, mailbox.password.get_secret_value()) == (DEMO_USER, DEMO_PASSWORD)


def test_configured_mailboxes_keep_their_values_and_get_the_dev_servers_for_the_rest():
    configured = json.dumps([{"name": "billing", "port": 2143, "folder": "Bills"}])
    (mailbox,) = IntakeSettings(mailboxes=json.loads(dev_mailboxes(configured))).mailboxes
    assert (mailbox.name, mailbox.port, mailbox.folder) == ("billing", 2143, "Bills")
    assert (mailbox.host, mailbox.security, mailbox.username) == ("127.0.0.1", "plain", DEMO_USER)


def test_broken_json_is_left_for_the_settings_to_report():
    assert dev_mailboxes("notjson") == "notjson"
