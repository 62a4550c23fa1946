"""NATS over TLS with a login: our adapter connects with the right settings and fails in one
clear line with wrong ones (nats-server from a configuration file, certificates made here)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from mailroom.adapters.nats import NatsClient, OutgoingMessage
from mailroom.errors import NatsUnavailable
from mailroom.settings import NatsSettings, TlsFiles
from tests.fixtures.links import ConfiguredNats, TestCa

pytestmark = pytest.mark.integration

PASSWORD = "s3cret-nats-password"

#: TLS with client certificates required, and one user with a password.
CONFIG = """
tls {
  cert_file: "%(server_cert)s"
  key_file: "%(server_key)s"
  ca_file: "%(ca_file)s"
  verify: true
  timeout: 2
}
authorization {
  users = [ { user: mailroom, password: $LINK_TEST_PASSWORD } ]
}
"""


@pytest.fixture(scope="module")
def tls_nats(test_ca: TestCa, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConfiguredNats]:
    folder = tmp_path_factory.mktemp("nats-tls")
    config = folder / "nats.conf"
    config.write_text(
        CONFIG
        % {
            "server_cert": test_ca.server_cert,
            "server_key": test_ca.server_key,
            "ca_file": test_ca.ca_file,
        }
    )
    server = ConfiguredNats(folder, config, {"LINK_TEST_PASSWORD": PASSWORD}).start()
    yield server
    server.stop()


def _settings(server: ConfiguredNats, test_ca: TestCa, **overrides: object) -> NatsSettings:
    values: dict[str, object] = {
        "url": server.url_for("tls"),
        "jetstream": False,
        "user": "mailroom",
        "password": PASSWORD,
        "tls": TlsFiles(
            ca_file=test_ca.ca_file, cert_file=test_ca.client_cert, key_file=test_ca.client_key
        ),
        "connect_timeout_s": 1.0,
        "reconnect_wait_s": 0.1,
        "initial_connect_attempts": 1,
    }
    return NatsSettings(**{**values, **overrides})


async def _connect_error(settings: NatsSettings) -> str:
    client = NatsClient(settings, name="link-test")
    with pytest.raises(NatsUnavailable) as caught:
        await client.connect()
    await client.close()
    return str(caught.value)


async def test_the_adapter_connects_over_tls_with_its_certificate_and_password(tls_nats, test_ca):
    settings = _settings(tls_nats, test_ca, subject_prefix="tls.")
    client = NatsClient(settings, name="link-test")
    await client.connect()
    try:
        watch = await client.watch(settings.subject("probe"))
        await client.publish(OutgoingMessage(settings.subject("probe"), b"over tls", "m1"))
        received = await asyncio.wait_for(watch.fetch(1, 2.0), 5.0)
        await watch.close()
    finally:
        await client.close()
    assert [m.data for m in received] == [b"over tls"]


async def test_a_wrong_password_is_one_line_naming_the_login_without_the_password(
    tls_nats, test_ca
):
    message = await _connect_error(_settings(tls_nats, test_ca, password="wrong-password"))
    assert "NATS refused the login (user 'mailroom')" in message
    assert "\n" not in message
    assert "wrong-password" not in message and PASSWORD not in message


async def test_a_server_certificate_from_another_ca_fails_as_tls(tls_nats, test_ca):
    tls = TlsFiles(
        ca_file=test_ca.other_ca_file, cert_file=test_ca.client_cert, key_file=test_ca.client_key
    )
    message = await _connect_error(_settings(tls_nats, test_ca, tls=tls, connect_timeout_s=0.5))
    assert "TLS failed" in message and "CERTIFICATE_VERIFY_FAILED" in message
    assert "\n" not in message


async def test_without_a_client_certificate_the_server_refuses_the_link(tls_nats, test_ca):
    message = await _connect_error(
        _settings(tls_nats, test_ca, tls=TlsFiles(ca_file=test_ca.ca_file))
    )
    assert message.startswith(f"connect {tls_nats.url_for('tls')}:")
    assert "\n" not in message


async def test_the_reference_recognizer_takes_the_same_login_and_tls(tls_nats, test_ca, tmp_path):
    from mailroom.recognizer.service import ReferenceRecognizer
    from mailroom.settings import Settings

    nats_settings = _settings(tls_nats, test_ca, subject_prefix="recognizer-tls.")
    settings = Settings(state_dir=tmp_path, nats=nats_settings.model_dump())
    recognizer = ReferenceRecognizer(settings)
    await recognizer.start()
    try:
        assert recognizer._nc is not None and recognizer._nc.is_connected
        assert recognizer._nc.connected_url.scheme == "tls"
    finally:
        await recognizer.stop()
