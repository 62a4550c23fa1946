"""Settings from files: ``MAILROOM_…_FILE`` variables and the ``MAILROOM_SECRETS_DIR`` folder."""

from __future__ import annotations

import json

import pytest
from pydantic_settings import SettingsError

from mailroom.cli.errors import EXIT_CONFIG, describe
from mailroom.errors import SecretFileError
from mailroom.settings import Settings
from mailroom.settings.secret_files import with_secret_files

SECRET = "s3cret-from-a-file"
DB_URL = f"postgresql+psycopg://mailroom:{SECRET}@db.internal:5432/mailroom"


def _one_line(exc: BaseException) -> str:
    failure = describe(exc)
    assert failure is not None
    assert failure.exit_code == EXIT_CONFIG
    [line] = failure.lines
    return line


def test_a_file_variable_sets_a_nested_secret_and_its_newline_is_dropped(tmp_path, monkeypatch):
    (tmp_path / "s3-secret").write_text(SECRET + "\n")
    monkeypatch.setenv("MAILROOM_STORAGE__S3_SECRET_KEY_FILE", str(tmp_path / "s3-secret"))
    settings = Settings()
    assert settings.storage.s3_secret_key.get_secret_value() == SECRET
    assert SECRET not in repr(settings) and SECRET not in str(settings.model_dump())


def test_a_file_variable_sets_a_plain_nested_setting(tmp_path, monkeypatch):
    (tmp_path / "db-url").write_text(DB_URL)
    monkeypatch.setenv("MAILROOM_DATABASE__URL_FILE", str(tmp_path / "db-url"))
    assert Settings().database.url == DB_URL


def test_a_json_list_may_come_from_a_file(tmp_path, monkeypatch):
    mailboxes = [{"name": "billing", "host": "imap.corp", "username": "u", "password": SECRET}]
    (tmp_path / "mailboxes.json").write_text(json.dumps(mailboxes))
    monkeypatch.setenv("MAILROOM_INTAKE__MAILBOXES_FILE", str(tmp_path / "mailboxes.json"))
    [mailbox] = Settings().intake.mailboxes
    assert mailbox.password.get_secret_value() == SECRET


def test_a_key_of_a_mapping_item_may_come_from_a_file(tmp_path, monkeypatch):
    secret = "whsec_c2VjcmV0IG9mIHRoZSB3ZWJob29rIHRlc3Rz"
    (tmp_path / "erp-secrets").write_text(json.dumps([secret]) + "\n")
    monkeypatch.setenv("MAILROOM_DELIVERY__WEBHOOK_ALLOWED_HOSTS", '["hooks.example.com"]')
    monkeypatch.setenv(
        "MAILROOM_DELIVERY__WEBHOOK_ACCOUNTS__ERP__URL", "https://hooks.example.com/"
    )
    monkeypatch.setenv(
        "MAILROOM_DELIVERY__WEBHOOK_ACCOUNTS__ERP__SECRETS_FILE", str(tmp_path / "erp-secrets")
    )
    [found] = Settings().delivery.webhook_accounts["erp"].secrets
    assert found.get_secret_value() == secret


def test_the_secrets_directory_holds_files_named_like_variables(tmp_path, monkeypatch):
    (tmp_path / "MAILROOM_SENTRY__DSN").write_text("https://key@sentry.test/1\n")
    (tmp_path / "MAILROOM_DATABASE__URL").write_text("from-the-directory")
    (tmp_path / "other-program-key").write_text("ignored")
    (tmp_path / "..data").mkdir()  # what a mounted Kubernetes secret also holds
    monkeypatch.setenv("MAILROOM_SECRETS_DIR", str(tmp_path))
    monkeypatch.setenv("MAILROOM_DATABASE__URL", "from-the-environment")
    settings = Settings()
    assert settings.sentry.dsn is not None
    assert settings.sentry.dsn.get_secret_value() == "https://key@sentry.test/1"
    assert settings.database.url == "from-the-environment"  # a variable beats the folder


def test_a_missing_file_is_one_line_naming_the_variable_and_path(tmp_path, monkeypatch):
    monkeypatch.setenv("MAILROOM_DATABASE__URL_FILE", str(tmp_path / "nope"))
    with pytest.raises(SecretFileError) as caught:
        Settings()
    line = _one_line(caught.value)
    assert line.startswith("mailroom: configuration error: MAILROOM_DATABASE__URL_FILE: no file")
    assert "nope" in line


def test_an_unreadable_file_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("MAILROOM_DATABASE__URL_FILE", str(tmp_path))  # a folder, not a file
    with pytest.raises(SettingsError) as caught:
        Settings()
    assert "MAILROOM_DATABASE__URL_FILE: cannot read" in _one_line(caught.value)


def test_a_missing_secrets_directory_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("MAILROOM_SECRETS_DIR", str(tmp_path / "gone"))
    with pytest.raises(SettingsError) as caught:
        Settings()
    assert "MAILROOM_SECRETS_DIR: cannot list" in _one_line(caught.value)


def test_a_variable_and_its_file_variable_together_are_refused(tmp_path, monkeypatch):
    (tmp_path / "db-url").write_text(DB_URL)
    monkeypatch.setenv("MAILROOM_DATABASE__URL", DB_URL)
    monkeypatch.setenv("MAILROOM_DATABASE__URL_FILE", str(tmp_path / "db-url"))
    with pytest.raises(SettingsError, match="are both set: keep one"):
        Settings()


def test_broken_json_in_a_file_is_named_without_its_text(tmp_path, monkeypatch):
    (tmp_path / "mailboxes.json").write_text(f'[{{"password": "{SECRET}"')
    monkeypatch.setenv("MAILROOM_INTAKE__MAILBOXES_FILE", str(tmp_path / "mailboxes.json"))
    with pytest.raises(SettingsError) as caught:
        Settings()
    line = _one_line(caught.value)
    assert "MAILROOM_INTAKE__MAILBOXES is not valid JSON" in line
    assert SECRET not in line


def test_an_invalid_value_from_a_file_names_the_file_variable_not_the_value(tmp_path, monkeypatch):
    (tmp_path / "size").write_text(SECRET)
    monkeypatch.setenv("MAILROOM_DATABASE__POOL_SIZE_FILE", str(tmp_path / "size"))
    with pytest.raises(Exception) as caught:
        Settings()
    line = _one_line(caught.value)
    assert line.startswith("mailroom: configuration error: MAILROOM_DATABASE__POOL_SIZE_FILE:")
    assert SECRET not in line


def test_a_setting_whose_name_ends_in_file_keeps_its_meaning(tmp_path):
    settings = {"MAILROOM_TLS__CA_FILE", "MAILROOM_TLS__CA", "MAILROOM_TOKEN"}
    (tmp_path / "token").write_text(SECRET)
    env = {"mailroom_tls__ca_file": "/etc/ca.pem", "mailroom_token_file": str(tmp_path / "token")}
    found = with_secret_files(env, settings.__contains__, case_sensitive=False)
    assert found == {"mailroom_tls__ca_file": "/etc/ca.pem", "mailroom_token": SECRET}


def test_unknown_file_variables_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("MAILROOM_DATABASE__NOPE_FILE", str(tmp_path / "x"))
    with pytest.raises(SettingsError, match="MAILROOM_DATABASE__NOPE_FILE is not a setting"):
        Settings()
