"""One masking of URLs for errors, logs and status; secret values masked, identifiers kept."""

from __future__ import annotations

import io
import logging

import pytest
from pydantic import SecretStr

from mailroom.process.observability import SecretScrubber, secret_values
from mailroom.redaction import has_credentials, mask_urls, mask_values
from mailroom.settings import Settings, StorageSettings


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("postgresql://app:pw@db:5432/x", "postgresql://app:***@db:5432/x"),
        ("postgresql://app:p/w@db/x", "postgresql://app:***@db/x"),
        ("postgresql://app@db/x?sslpassword=kp&sslmode=require", None),
        ("redis://:pw@r:6379/0", "redis://:***@r:6379/0"),
        ("redis://r:6379/0?password=pw", "redis://r:6379/0?password=***"),
        ("nats://SomeToken@n:4222", "nats://***@n:4222"),
        ("tls://SomeToken@n:4222", "tls://***@n:4222"),
        ("nats://user:pw@n:4222", "nats://user:***@n:4222"),
        ("https://u:pw@hooks.test/in?token=t&id=7", "https://u:***@hooks.test/in?token=***&id=7"),
        ("https://hooks.test/in?Secret=s", "https://hooks.test/in?Secret=***"),
        ("host=db user=app password=pw dbname=x", "host=db user=app password=*** dbname=x"),
        ("failed: 'nats://tok@n:4222' refused", "failed: 'nats://***@n:4222' refused"),
    ],
)
def test_every_url_form_has_its_credentials_masked(text, masked):
    if masked is None:  # a parameter named like a secret, in a URL with a user but no password
        masked = "postgresql://app@db/x?sslpassword=***&sslmode=require"
    assert mask_urls(text) == masked


@pytest.mark.parametrize(
    "url",
    ["postgresql://app@db/x", "https://hooks.test/in?id=7", "redis://r:6379/0", "nats://n:4222"],
)
def test_user_names_hosts_and_other_parameters_stay_readable(url):
    assert mask_urls(url) == url
    assert not has_credentials(url)


def test_a_short_value_is_never_masked_by_substring():
    assert mask_values("mailbox billing is polled", ["bill", "billing"]) == (
        "mailbox billing is polled"
    )


def test_a_secret_value_is_masked_where_it_stands_alone_not_inside_a_name():
    secret = "mailroom"
    line = "process mailroom-scheduler logged in with mailroom"
    assert mask_values(line, [secret]) == "process mailroom-scheduler logged in with [redacted]"


def test_the_s3_access_key_id_is_no_secret_and_reaches_logs_as_it_is():
    settings = Settings(
        storage=StorageSettings(
            kind="s3", s3_access_key="mailroom", s3_secret_key=SecretStr("s3-secret-key-value")
        )
    )
    assert secret_values(settings) == {"s3-secret-key-value"}
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(SecretScrubber(secret_values(settings)))
    logger = logging.getLogger("mailroom.test.redaction")
    logger.addHandler(handler)
    try:
        logger.warning("mailroom-scheduler: s3 key mailroom, secret s3-secret-key-value")
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue() == "mailroom-scheduler: s3 key mailroom, secret [redacted]\n"
