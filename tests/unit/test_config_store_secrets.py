"""Secrets of runtime configuration rows: encrypted at rest, masked when shown, refused without a key."""

from __future__ import annotations

import json

import pytest
from cryptography.fernet import Fernet

from mailroom.config_store import kinds, secrets
from mailroom.config_store.secrets import MASK, Cipher
from mailroom.errors import RuntimeConfigInvalid
from mailroom.settings import DeliverySettings, MailboxSettings, WebhookAccount

WEBHOOK_SECRET = "whsec_" + "c2VjcmV0IG9mIHRoZSB3ZWJob29rIHRlc3Rz"


def test_every_secret_is_encrypted_and_the_same_model_reads_it_back():
    cipher = Cipher(Fernet.generate_key().decode())
    mailbox = MailboxSettings(name="box", host="imap.test", username="u", password="hunter2")
    stored = secrets.dump(mailbox, cipher, where="mailbox 'box'")
    assert "hunter2" not in json.dumps(stored)
    assert set(stored["password"]) == {secrets.FERNET}
    back = MailboxSettings.model_validate(secrets.load(stored, cipher, where="x"))
    assert back.password.get_secret_value() == "hunter2"
    assert secrets.masked(stored)["password"] == MASK


def test_a_list_of_webhook_secrets_is_encrypted_item_by_item_and_masked():
    cipher = Cipher(Fernet.generate_key().decode())
    account = WebhookAccount(url="https://hooks.example.com/x", secrets=[WEBHOOK_SECRET])
    stored = secrets.dump(account, cipher, where="account")
    assert WEBHOOK_SECRET not in json.dumps(stored)
    assert secrets.masked(stored) == {"url": "https://hooks.example.com/x", "secrets": [MASK]}


def test_rotation_decrypts_with_an_older_key_listed_second():
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    stored = secrets.dump(
        MailboxSettings(name="b", host="h", username="u", password="pw"), Cipher(old), where="x"
    )
    plain = secrets.load(stored, Cipher(f"{new},{old}"), where="x")
    assert plain["password"] == "pw"


def test_a_secret_without_a_key_or_with_another_key_is_one_clear_line():
    mailbox = MailboxSettings(name="b", host="h", username="u", password="pw")
    with pytest.raises(RuntimeConfigInvalid, match=r"runtime_config.key is not set"):
        secrets.dump(mailbox, Cipher(""), where="mailbox 'b'")
    stored = secrets.dump(mailbox, Cipher(Fernet.generate_key().decode()), where="x")
    with pytest.raises(RuntimeConfigInvalid, match=r"does not decrypt"):
        secrets.load(stored, Cipher(Fernet.generate_key().decode()), where="mailbox 'b'")
    with pytest.raises(RuntimeConfigInvalid, match=r"not a Fernet key"):
        Cipher("not-a-key")


def test_rows_are_validated_by_the_settings_models():
    delivery = DeliverySettings()
    with pytest.raises(RuntimeConfigInvalid, match=r"account 'ops'.*channel:account"):
        kinds.validate("account", "ops", {"url": "https://x.example.com"}, delivery=delivery)
    with pytest.raises(RuntimeConfigInvalid, match=r"webhook:ops.*(allow|ALLOW)"):
        kinds.validate("account", "webhook:ops", {"url": "http://10.0.0.1/"}, delivery=delivery)
    with pytest.raises(RuntimeConfigInvalid, match=r"route 'r'.*unknown placeholder"):
        kinds.validate("route", "r", {"template": "{nope}"}, delivery=delivery)
    with pytest.raises(RuntimeConfigInvalid, match=r"mailbox 'a': config name 'b' differs"):
        kinds.validate(
            "mailbox", "a", {"name": "b", "host": "h", "username": "u"}, delivery=delivery
        )
    route = kinds.validate("route", "r", {"channel": "log", "recipient": "x"}, delivery=delivery)
    assert route.recipient == "x"  # type: ignore[attr-defined]


def test_a_mistyped_key_fails_at_load_in_one_line():
    from pydantic import ValidationError

    from mailroom.settings import RuntimeConfigSettings

    good = Fernet.generate_key().decode()
    assert RuntimeConfigSettings(key=f"{good},{good}").key.get_secret_value().startswith(good)
    with pytest.raises(ValidationError, match=r"key 2 is not a Fernet key"):
        RuntimeConfigSettings(key=f"{good},oops")


def test_a_nested_oauth_client_secret_is_encrypted_and_masked_too():
    cipher = Cipher(Fernet.generate_key().decode())
    oauth = {
        "token_url": "https://login.example.com/token",
        "client_id": "mailroom",
        "client_secret": "s3cr3t-value",
        "grant": "client_credentials",
    }
    mailbox = MailboxSettings(name="o", host="h", username="u", auth="xoauth2", oauth=oauth)
    stored = secrets.dump(mailbox, cipher, where="mailbox 'o'")
    assert "s3cr3t-value" not in json.dumps(stored)
    assert secrets.masked(stored)["oauth"]["client_secret"] == MASK
    back = MailboxSettings.model_validate(secrets.load(stored, cipher, where="x"))
    assert back.oauth is not None and back.oauth.client_secret.get_secret_value() == "s3cr3t-value"
