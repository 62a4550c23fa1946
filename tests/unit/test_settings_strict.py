"""Loading settings refuses typos, broken JSON, unknown template placeholders and contradictions."""

from __future__ import annotations

import json

import psycopg
import pytest
from pydantic import ValidationError
from pydantic_settings import SettingsError

from mailroom.cli.errors import EXIT_CONFIG, EXIT_UNAVAILABLE, describe
from mailroom.redaction import mask_urls
from mailroom.settings import (
    ROUTE_PLACEHOLDERS,
    DeliverySettings,
    NatsSettings,
    NotificationRoute,
    RecognitionSettings,
    Settings,
    WebhookAccount,
)

MAILBOX = {"name": "billing", "host": "imap.corp", "username": "u", "password": "p"}


def _config_error(exc: BaseException) -> str:
    failure = describe(exc)
    assert failure is not None
    assert failure.exit_code == EXIT_CONFIG
    return "\n".join(failure.lines)


def test_unknown_variable_is_an_error_naming_it_and_where_the_key_lives(monkeypatch):
    monkeypatch.setenv("MAILROOM_INTAKE__BATCH_SIZE", "10")
    with pytest.raises(SettingsError) as caught:
        Settings()
    message = _config_error(caught.value)
    assert "MAILROOM_INTAKE__BATCH_SIZE is not a setting" in message
    assert "MAILROOM_INTAKE__MAILBOXES" in message  # batch_size is set per mailbox


def test_misspelt_top_level_variable_gets_a_suggestion(monkeypatch):
    monkeypatch.setenv("MAILROOM_DATABSE__URL", "postgresql+psycopg://db/x")
    with pytest.raises(SettingsError, match="did you mean MAILROOM_DATABASE__URL"):
        Settings()


def test_one_underscore_where_groups_nest_suggests_the_nested_variable(monkeypatch):
    monkeypatch.setenv("MAILROOM_DATABASE_URL", "postgresql+psycopg://db/x")
    with pytest.raises(SettingsError) as caught:
        Settings()
    assert "(did you mean MAILROOM_DATABASE__URL?)" in _config_error(caught.value)


def test_misspelt_file_variable_is_suggested_with_its_file_suffix(monkeypatch, tmp_path):
    monkeypatch.setenv("MAILROOM_INTAKE__MAILBOXS_FILE", str(tmp_path / "mailboxes.json"))
    with pytest.raises(SettingsError) as caught:
        Settings()
    assert "(did you mean MAILROOM_INTAKE__MAILBOXES_FILE?)" in _config_error(caught.value)


def test_a_webhook_outside_the_allow_list_names_the_variables_to_set(monkeypatch):
    monkeypatch.setenv("MAILROOM_DELIVERY__WEBHOOK_ACCOUNTS__ERP__URL", "https://hooks.test/")
    with pytest.raises(ValidationError) as caught:
        Settings()
    assert _config_error(caught.value) == (
        "mailroom: configuration error: MAILROOM_DELIVERY__WEBHOOK_ACCOUNTS__ERP: delivery: "
        "webhook_accounts.erp: webhook host 'hooks.test' is not in "
        "MAILROOM_DELIVERY__WEBHOOK_ALLOWED_HOSTS"
    )


@pytest.mark.parametrize(
    ("settings", "variable"),
    [
        ({"redis": {"tls": {"ca_file": "/no/such/ca.pem"}}}, "MAILROOM_REDIS__TLS__CA_FILE"),
        ({"intake": {"lease_s": 0}}, "MAILROOM_INTAKE__LEASE_S"),
        (
            {"delivery": {"routes": [{"channel": "webhook", "account": "erp"}]}},
            "MAILROOM_DELIVERY__ROUTES",
        ),
    ],
)
def test_every_settings_error_names_a_variable_to_set(settings, variable):
    with pytest.raises(ValidationError) as caught:
        Settings(**settings)
    assert variable in _config_error(caught.value)


def test_value_below_a_single_value_setting_is_unknown(monkeypatch):
    monkeypatch.setenv("MAILROOM_INTAKE__LEASE_S__SECONDS", "10")
    with pytest.raises(SettingsError, match="MAILROOM_INTAKE__LEASE_S takes one value"):
        Settings()


def test_keys_of_mapping_items_may_come_from_their_own_variables(monkeypatch):
    monkeypatch.setenv("MAILROOM_DELIVERY__WEBHOOK_ACCOUNTS__HOOKS__URL", "https://hooks.test/")
    monkeypatch.setenv("MAILROOM_DELIVERY__WEBHOOK_ALLOWED_HOSTS", '["hooks.test"]')
    assert Settings().delivery.webhook_accounts["hooks"].url == "https://hooks.test/"


def test_unknown_nested_key_is_named_alone_with_its_variable(monkeypatch):
    mailbox = {"name": "x", "host": "h", "pasword": "p"}
    monkeypatch.setenv("MAILROOM_INTAKE__MAILBOXES", json.dumps([mailbox]))
    with pytest.raises(ValidationError) as caught:
        Settings()
    # The typo also leaves password (and username) missing; only the typo is worth a line.
    assert _config_error(caught.value) == (
        "mailroom: configuration error: MAILROOM_INTAKE__MAILBOXES: unknown key 'pasword' "
        "in intake.mailboxes.0 (did you mean 'password'?)"
    )


@pytest.mark.parametrize(
    ("variable", "value", "key"),
    [
        ("MAILROOM_NATS__URLL", "nats://x", None),
        ("MAILROOM_DELIVERY__ROUTES", '[{"chanel": "log"}]', "chanel"),
        ("MAILROOM_DELIVERY__EMAIL_ACCOUNTS", '{"a": {"host": "h", "securty": "ssl"}}', "securty"),
        ("MAILROOM_RECOGNITION__DOCUMENT_TYPES", '{"x": {"requird": []}}', "requird"),
    ],
)
def test_every_nested_model_refuses_unknown_keys(monkeypatch, variable, value, key):
    monkeypatch.setenv(variable, value)
    with pytest.raises((ValidationError, SettingsError)) as caught:
        Settings()
    message = _config_error(caught.value)
    assert variable in message
    if key:
        assert repr(key) in message


def test_invalid_json_names_the_variable(monkeypatch):
    monkeypatch.setenv("MAILROOM_INTAKE__MAILBOXES", "notjson")
    with pytest.raises(SettingsError) as caught:
        Settings()
    assert _config_error(caught.value) == (
        "mailroom: configuration error: MAILROOM_INTAKE__MAILBOXES is not valid JSON "
        "(Expecting value at character 0)"
    )


def test_route_template_with_unknown_placeholder_fails_at_load_naming_route_and_placeholder():
    with pytest.raises(ValidationError) as caught:
        NotificationRoute(channel="webhook", recipient="finance", subject="Docs from {sendr}")
    message = _config_error(caught.value)
    assert "route webhook:default -> finance" in message
    assert "{sendr}" in message
    assert "sender" in message  # the known names are listed


@pytest.mark.parametrize("template", ["{summary", "{0}", "{mail_subject!x}", "{uid:%Q}"])
def test_malformed_route_template_fails_at_load(template):
    with pytest.raises(ValidationError, match="template"):
        NotificationRoute(template=template)


def test_every_known_placeholder_and_its_format_specs_are_accepted():
    text = " ".join(f"{{{name}}}" for name in ROUTE_PLACEHOLDERS) + " {mail_subject!r:.20}"
    assert NotificationRoute(template=text).template == text


def test_route_to_an_account_that_does_not_exist_fails_at_load():
    delivery = DeliverySettings(
        webhook_accounts={"default": WebhookAccount(url="https://hooks.test/")},
        webhook_allowed_hosts=["hooks.test"],
        routes=[NotificationRoute(channel="webhook", account="finance")],
    )
    with pytest.raises(ValidationError, match="no webhook account 'finance'"):
        Settings(delivery=delivery)


def test_no_ack_window_shorter_than_twice_the_bridge_ack_wait_fails_at_load():
    # 5 s x (3 + 1) = 20 s: an ack redelivered after the bridge's 30 s wait comes too late.
    with pytest.raises(ValidationError) as caught:
        Settings(
            recognition=RecognitionSettings(ack_timeout_s=5, max_republish=3, silence_after_s=10),
            nats=NatsSettings(bridge_ack_wait_s=30),
        )
    message = _config_error(caught.value)
    assert "MAILROOM_RECOGNITION__ACK_TIMEOUT_S" in message
    assert "MAILROOM_NATS__BRIDGE_ACK_WAIT_S" in message
    Settings(
        recognition=RecognitionSettings(ack_timeout_s=5, max_republish=3, silence_after_s=10),
        nats=NatsSettings(bridge_ack_wait_s=10),
    )


def test_a_gate_that_would_close_after_the_no_ack_window_fails_at_load_naming_both():
    # 5 s x (3 + 1) = 20 s: jobs would be dead-lettered before 60 s of silence closes the gate.
    recognition = RecognitionSettings(ack_timeout_s=5, max_republish=3, silence_after_s=60)
    with pytest.raises(ValidationError) as caught:
        Settings(recognition=recognition, nats=NatsSettings(bridge_ack_wait_s=10))
    assert _config_error(caught.value) == (
        "mailroom: configuration error: MAILROOM_RECOGNITION__SILENCE_AFTER_S = 60 s must be "
        "below the no-ack window MAILROOM_RECOGNITION__ACK_TIMEOUT_S x "
        "(MAILROOM_RECOGNITION__MAX_REPUBLISH + 1) = 20 s"
    )
    Settings(
        recognition=recognition.model_copy(update={"silence_after_s": 19}),
        nats=NatsSettings(bridge_ack_wait_s=10),
    )


def test_duplicate_mailbox_names_fail_at_load():
    with pytest.raises(ValidationError, match="names must be unique"):
        Settings(intake={"mailboxes": [MAILBOX, MAILBOX]})


def test_unreachable_postgres_is_two_lines_with_host_port_and_no_password(monkeypatch):
    monkeypatch.setenv("MAILROOM_DATABASE__URL", "postgresql+psycopg://app:s3cret@127.0.0.1:1/x")
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect("postgresql://app:s3cret@127.0.0.1:1/x", connect_timeout=2)
    assert describe(RuntimeError("a bug")) is None  # unknown errors keep their traceback
    failure = describe(caught.value)
    assert failure is not None
    assert failure.exit_code == EXIT_UNAVAILABLE
    assert len(failure.lines) == 2
    assert "cannot reach Postgres" in failure.lines[0]
    assert '"127.0.0.1", port 1' in failure.lines[0]
    assert "MAILROOM_DATABASE__URL" in failure.lines[1]
    assert "s3cret" not in "\n".join(failure.lines)


def test_passwords_in_urls_are_masked():
    text = "redis://:pw@h:6379/0 amqp://guest:guest@rabbit:5672/ postgresql://u@h/x"
    assert mask_urls(text) == (
        "redis://:***@h:6379/0 amqp://guest:***@rabbit:5672/ postgresql://u@h/x"
    )


def test_after_ingest_move_without_a_folder_fails_at_load_in_one_line():
    with pytest.raises(ValidationError) as caught:
        Settings(intake={"mailboxes": [{**MAILBOX, "after_ingest": "move"}]})
    assert _config_error(caught.value) == (
        "mailroom: configuration error: MAILROOM_INTAKE__MAILBOXES: intake.mailboxes.0: "
        "mailbox 'billing': after_ingest 'move' needs move_to (a folder)"
    )
    moving = Settings(
        intake={"mailboxes": [{**MAILBOX, "after_ingest": "move", "move_to": "Done"}]}
    )
    assert moving.intake.mailboxes[0].move_to == "Done"


@pytest.mark.parametrize("flag", ["$Mailroom", "\\Flagged", "Processed_1"])
def test_after_ingest_flag_takes_keywords_and_system_flags(flag):
    assert Settings(intake={"mailboxes": [{**MAILBOX, "after_ingest_flag": flag}]})


@pytest.mark.parametrize("flag", ["", "two words", "(x)", "a*", "\\", 'say"'])
def test_after_ingest_flag_that_is_no_imap_flag_fails_at_load(flag):
    with pytest.raises(ValidationError, match="is not an IMAP flag"):
        Settings(intake={"mailboxes": [{**MAILBOX, "after_ingest_flag": flag}]})


def test_after_ingest_move_to_the_folder_it_reads_fails_at_load():
    mailbox = {**MAILBOX, "after_ingest": "move", "move_to": "INBOX"}
    with pytest.raises(ValidationError, match="move_to is the folder it reads"):
        Settings(intake={"mailboxes": [mailbox]})
