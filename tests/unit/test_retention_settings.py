"""Retention settings: kept forever unless a mailbox says; a mistyped period is one clear line."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from mailroom.cli.errors import EXIT_CONFIG, describe
from mailroom.settings import Settings

MAILBOX = {"name": "billing", "host": "imap.test", "username": "u", "password": "p"}


def test_nothing_expires_by_default():
    settings = Settings(intake={"mailboxes": [MAILBOX]})
    assert settings.intake.mailboxes[0].retention_days is None
    assert settings.retention.deletion_grace_s > 0


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        (
            "MAILROOM_INTAKE__MAILBOXES",
            json.dumps([{**MAILBOX, "retention_days": 0}]),
            "retention_days",
        ),
        ("MAILROOM_RETENTION__BATCH_SIZE", "0", "batch_size"),
        ("MAILROOM_RETENTION__DELETION_GRACE_S", "-1", "deletion_grace_s"),
    ],
)
def test_a_period_or_batch_that_is_not_positive_is_refused_with_its_name(
    monkeypatch, variable, value, named
):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as caught:
        Settings()
    failure = describe(caught.value)
    assert failure is not None and failure.exit_code == EXIT_CONFIG
    assert any(named in line for line in failure.lines), failure.lines
