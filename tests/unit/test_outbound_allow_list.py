"""The outbound allow-list and header checks (``mailroom.outbound``), and their settings."""

from __future__ import annotations

import ipaddress

import pytest
from pydantic import ValidationError

from mailroom.cli.errors import describe
from mailroom.errors import UnsafeHeaderValue, WebhookTargetRefused
from mailroom.outbound import AllowList, check_addresses, check_header_value, check_url
from mailroom.settings import DeliverySettings, EmailAccount, Settings

ALLOW = AllowList.parse(["hooks.example.com", "*.partner.test", "10.1.0.0/16", "::1"])


def ips(*texts: str):
    return [ipaddress.ip_address(text) for text in texts]


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/x",
        "https://HOOKS.example.com.:8443/x",
        "https://eu.partner.test/x",
        "https://10.1.2.3/x",
        "https://[::1]:8080/x",
    ],
)
def test_listed_hosts_and_addresses_pass(url):
    assert check_url(url, ALLOW)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https://evil.example.com/x", "host 'evil.example.com' is not in"),
        ("https://partner.test/x", "host 'partner.test' is not in"),  # *. is below the name
        ("https://127.0.0.1/x", "address 127.0.0.1 is not in"),
        ("https://169.254.169.254/latest/meta-data", "address 169.254.169.254 is not in"),
        ("https://[::ffff:127.0.0.1]/x", "address 127.0.0.1 is not in"),
        ("https://8.8.8.8/x", "address 8.8.8.8 is not in"),
        ("http://hooks.example.com/x", "plain http"),
        ("ftp://hooks.example.com/x", "is not an http"),
    ],
)
def test_unlisted_hosts_addresses_and_plain_http_are_refused(url, reason):
    with pytest.raises(WebhookTargetRefused, match=reason):
        check_url(url, ALLOW)


def test_plain_http_only_when_allowed():
    allow = AllowList.parse(["127.0.0.1"], allow_http=True)
    assert check_url("http://127.0.0.1:8080/hook", allow) == "127.0.0.1"


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.0.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "fe80::1",
        "fd00::1",
        "::ffff:192.168.1.1",
        "224.0.0.1",
    ],
)
def test_a_name_resolving_to_a_non_public_address_is_refused(address):
    with pytest.raises(WebhookTargetRefused, match="not a public address"):
        check_addresses("hooks.example.com", ips(address), ALLOW)


def test_one_private_address_among_public_ones_is_enough_to_refuse():
    with pytest.raises(WebhookTargetRefused, match=r"resolves to 192\.168\.0\.9"):
        check_addresses("hooks.example.com", ips("93.184.216.34", "192.168.0.9"), ALLOW)


def test_public_addresses_and_listed_networks_pass():
    check_addresses("hooks.example.com", ips("93.184.216.34", "2606:4700::1111"), ALLOW)
    check_addresses("hooks.internal", ips("10.1.200.7", "::1"), ALLOW)


def test_bad_entries_are_refused():
    with pytest.raises(ValueError, match="'a b' is neither"):
        AllowList.parse(["a b"])


@pytest.mark.parametrize(
    "value", ["Invoice\r\nBcc: x@evil.test", "a\nb", "a\rb", "nul\x00", "\x1b[2J", "a\u2028b"]
)
def test_header_values_with_controls_are_refused(value):
    with pytest.raises(UnsafeHeaderValue, match="control character"):
        check_header_value("Subject", value)


def test_header_values_with_tabs_and_any_script_pass():
    assert (
        check_header_value("Subject", "Rechnung\tNr. 42 Ü ✓ 請求書")
        == "Rechnung\tNr. 42 Ü ✓ 請求書"
    )


def test_the_default_allows_no_webhook_host():
    with pytest.raises(ValidationError, match=r"host 'hooks\.example\.com' is not in"):
        DeliverySettings(webhook_accounts={"a": {"url": "https://hooks.example.com/"}})


def test_an_unlisted_webhook_url_is_one_configuration_line(monkeypatch):
    monkeypatch.setenv("MAILROOM_DELIVERY__WEBHOOK_ACCOUNTS", '{"a": {"url": "https://10.0.0.5/"}}')
    with pytest.raises(ValidationError) as caught:
        Settings()
    failure = describe(caught.value)
    assert failure is not None
    assert failure.lines == [
        "mailroom: configuration error: MAILROOM_DELIVERY__WEBHOOK_ACCOUNTS: delivery: "
        "webhook_accounts.a: webhook address 10.0.0.5 is not in "
        "MAILROOM_DELIVERY__WEBHOOK_ALLOWED_HOSTS"
    ]


def test_a_sender_with_a_line_break_is_refused_at_load():
    with pytest.raises(ValidationError, match="sender: header From would carry"):
        EmailAccount(host="smtp.test", sender="mailroom@corp.test\r\nBcc: all@evil.test")
