"""No anonymous NATS outside `mailroom dev`: on a server that lets anyone in, anyone could read
the requests and answer them, so a process whose NATS link has no login refuses to start (one
line, exit 2) unless `nats.allow_anonymous` says the open server is meant."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mailroom.adapters.nats import NatsClient
from mailroom.db.migrate import PROJECT_ROOT
from mailroom.errors import NatsAnonymousRefused
from mailroom.settings import NatsSettings

pytestmark = pytest.mark.integration

REFUSAL = "NATS has no login (nats.user and password, token, nkey_seed_file or creds_file)"


def _run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    return subprocess.run(
        [sys.executable, "-m", "mailroom", *command],
        env={**clean, **env},
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "command", [["worker", "-Q", "outbox"], ["bridge", "nats"], ["recognizer"]], ids=" ".join
)
def test_a_process_with_no_nats_login_refuses_to_start_in_one_line(nats_url, tmp_path, command):
    # A real open server listens: the process refuses before it connects, not because of it.
    env = {
        "MAILROOM_NATS__URL": nats_url,
        "MAILROOM_STATE_DIR": str(tmp_path),
        # Nothing listens on these: a process that did not refuse would wait for them.
        "MAILROOM_DATABASE__URL": "postgresql+psycopg://postgres@127.0.0.1:1/mailroom",
        "MAILROOM_REDIS__URL": "redis://127.0.0.1:1/0",
    }

    result = _run(command, env)

    assert result.returncode == 2, result.stdout + result.stderr
    refused = [line for line in (result.stdout + result.stderr).splitlines() if REFUSAL in line]
    assert len(refused) == 1, result.stdout + result.stderr
    assert "MAILROOM_NATS__ALLOW_ANONYMOUS=true" in refused[0]


async def test_a_client_with_no_login_connects_only_when_anonymous_is_meant(nats_url):
    refused = NatsClient(NatsSettings(url=nats_url, jetstream=False), name="anonymous")
    with pytest.raises(NatsAnonymousRefused, match=r"^NATS has no login"):
        await refused.connect()
    assert not refused.is_connected

    meant = NatsSettings(url=nats_url, jetstream=False, allow_anonymous=True)
    allowed = NatsClient(meant, name="anonymous-meant")
    await allowed.connect()
    try:
        assert allowed.is_connected
    finally:
        await allowed.close()


def test_a_login_in_the_settings_or_the_url_is_a_login_and_the_dev_stack_is_exempt():
    assert NatsSettings(url="nats://nats.internal:4222").anonymous_refusal() is not None
    for settings in (
        NatsSettings(url="nats://nats.internal:4222", user="mailroom", password="secret"),
        NatsSettings(url="nats://mailroom:secret@nats.internal:4222"),
        NatsSettings(url="nats://s3cr3t-token@nats.internal:4222"),
        NatsSettings(url="nats://nats.internal:4222", token="t"),
        NatsSettings(url="nats://nats.internal:4222", allow_anonymous=True),
        NatsSettings(),  # the dev stack's own server on loopback, as `mailroom dev` runs it
    ):
        assert settings.anonymous_refusal() is None, settings
