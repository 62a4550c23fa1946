"""Standard Webhooks signing and verification (``mailroom.webhooks``), without a network."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from pydantic import ValidationError

from mailroom.settings import WebhookAccount
from mailroom.webhooks import (
    WebhookVerificationError,
    secret_key,
    sign,
    signature_headers,
    verify,
)

KEY = bytes(range(32))
SECRET = "whsec_" + base64.b64encode(KEY).decode()
NEW_SECRET = "whsec_" + base64.b64encode(b"n" * 32).decode()
BODY = b'{"message_id":7,"chunk":1}'
NOW = 1_700_000_000


def test_signature_is_the_hmac_of_id_timestamp_and_body_by_the_decoded_key():
    expected = hmac.new(KEY, b"7:1.1700000000." + BODY, hashlib.sha256).digest()
    assert sign(SECRET, "7:1", NOW, BODY) == "v1," + base64.b64encode(expected).decode()


def test_a_valid_request_returns_its_id():
    headers = signature_headers([SECRET], "7:1", BODY, timestamp=NOW)
    assert verify(headers, BODY, secrets=[SECRET], now=NOW + 10) == "7:1"


def test_one_secret_may_be_given_alone():
    headers = signature_headers([SECRET], "7:1", BODY, timestamp=NOW)
    assert verify(headers, BODY, secrets=SECRET, now=NOW) == "7:1"


def test_header_names_are_matched_without_case():
    headers = {
        k.title(): v for k, v in signature_headers([SECRET], "7:1", BODY, timestamp=NOW).items()
    }
    assert verify(headers, BODY, secrets=[SECRET], now=NOW) == "7:1"


@pytest.mark.parametrize("offset_s", [301, -301])
def test_a_replayed_or_future_request_is_stale(offset_s):
    headers = signature_headers([SECRET], "7:1", BODY, timestamp=NOW)
    with pytest.raises(WebhookVerificationError, match="stale timestamp"):
        verify(headers, BODY, secrets=[SECRET], now=NOW + offset_s)


def test_the_tolerance_is_five_minutes_both_ways():
    headers = signature_headers([SECRET], "7:1", BODY, timestamp=NOW)
    for offset_s in (300, -300):
        assert verify(headers, BODY, secrets=[SECRET], now=NOW + offset_s) == "7:1"


@pytest.mark.parametrize(
    "tamper",
    [
        lambda h, b: (h, b.replace(b"7", b"8")),
        lambda h, b: ({**h, "webhook-id": "7:2"}, b),
        lambda h, b: ({**h, "webhook-timestamp": str(NOW + 1)}, b),
        lambda h, b: ({**h, "webhook-signature": "v1," + base64.b64encode(b"x" * 32).decode()}, b),
    ],
    ids=["body", "id", "timestamp", "signature"],
)
def test_a_tampered_request_has_a_bad_signature(tamper):
    headers, body = tamper(signature_headers([SECRET], "7:1", BODY, timestamp=NOW), BODY)
    with pytest.raises(WebhookVerificationError, match="bad signature"):
        verify(headers, body, secrets=[SECRET], now=NOW)


def test_a_signature_by_another_secret_is_refused():
    headers = signature_headers([NEW_SECRET], "7:1", BODY, timestamp=NOW)
    with pytest.raises(WebhookVerificationError, match="bad signature"):
        verify(headers, BODY, secrets=[SECRET], now=NOW)


def test_rotation_each_side_may_hold_old_and_new_secrets():
    # The sender signs with both while receivers move over; either receiver accepts it.
    both = signature_headers([SECRET, NEW_SECRET], "7:1", BODY, timestamp=NOW)
    assert len(both["webhook-signature"].split(" ")) == 2
    assert verify(both, BODY, secrets=[SECRET], now=NOW) == "7:1"
    assert verify(both, BODY, secrets=[NEW_SECRET], now=NOW) == "7:1"
    # A receiver holding both accepts a sender that already dropped the old one.
    only_new = signature_headers([NEW_SECRET], "7:1", BODY, timestamp=NOW)
    assert verify(only_new, BODY, secrets=[SECRET, NEW_SECRET], now=NOW) == "7:1"


def test_missing_headers_are_named():
    headers = signature_headers([SECRET], "7:1", BODY, timestamp=NOW)
    del headers["webhook-signature"]
    with pytest.raises(WebhookVerificationError, match="missing header webhook-signature"):
        verify(headers, BODY, secrets=[SECRET], now=NOW)


def test_a_timestamp_that_is_no_number_is_refused():
    headers = {**signature_headers([SECRET], "7:1", BODY, timestamp=NOW), "webhook-timestamp": "x"}
    with pytest.raises(WebhookVerificationError, match="not unix seconds"):
        verify(headers, BODY, secrets=[SECRET], now=NOW)


def test_raw_secrets_are_their_bytes_and_short_ones_are_refused():
    assert secret_key("a raw secret of 24 bytes") == b"a raw secret of 24 bytes"
    with pytest.raises(ValueError, match="at least 16 bytes"):
        secret_key("short")
    with pytest.raises(ValueError, match="base64"):
        secret_key("whsec_not base64!")


def test_account_setting_takes_a_list_and_the_older_single_secret():
    account = WebhookAccount.model_validate({"url": "https://h.test/", "secret": SECRET})
    assert [s.get_secret_value() for s in account.secrets] == [SECRET]
    both = WebhookAccount(url="https://h.test/", secrets=[SECRET, NEW_SECRET])
    assert len(both.secrets) == 2
    assert SECRET not in repr(both)


def test_a_weak_account_secret_is_one_line_without_the_secret():
    with pytest.raises(ValidationError) as caught:
        WebhookAccount(url="https://h.test/", secrets=[SECRET, "tiny"])
    [error] = caught.value.errors()
    assert (
        error["msg"]
        == "Value error, secrets.1: a webhook secret must hold at least 16 bytes of key"
    )
    assert "tiny" not in error["msg"]


@pytest.mark.parametrize("secret", ["short", "whsec_not base64!", "whsec_" + "c2hvcnQ="])
def test_verify_raises_only_its_own_error_for_an_unusable_secret(secret):
    headers = signature_headers([SECRET], "7:1", BODY, timestamp=NOW)
    with pytest.raises(WebhookVerificationError, match="unusable secret") as caught:
        verify(headers, BODY, secrets=[secret], now=NOW)
    assert type(caught.value) is WebhookVerificationError
    assert secret not in str(caught.value)
