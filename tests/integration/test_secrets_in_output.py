"""No secret of a server URL in what Mailroom prints: one-line errors and a bridge's outage lines.

Real processes (``python -m mailroom``) against a real Postgres that refuses the login, a
Redis port nobody listens on and a NATS server that is not there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from mailroom.db.migrate import PROJECT_ROOT
from mailroom.devtools.stack import EmbeddedPostgres, free_port
from tests.integration.test_cli_errors import lines, mailroom

pytestmark = pytest.mark.integration

SECRET = "Query-Secret-4471"


def test_a_postgres_password_in_the_query_string_is_masked_in_the_one_line_error(
    postgres_server: EmbeddedPostgres,
):
    url = (
        f"postgresql+psycopg://no_such_role@127.0.0.1:{postgres_server.port}/postgres"
        f"?sslmode=disable&password={SECRET}"
    )
    result = mailroom("intake", "status", MAILROOM_DATABASE__URL=url)
    assert result.returncode == 1
    text = "\n".join(lines(result))
    assert "Postgres refused the login" in text
    assert "password=***" in text and "no_such_role" in text
    assert SECRET not in text


def test_a_redis_password_in_the_query_string_is_masked_in_the_one_line_error():
    url = f"redis://127.0.0.1:{free_port()}/0?password={SECRET}"
    result = mailroom("dead-letters", "list", MAILROOM_REDIS__URL=url)
    assert result.returncode == 1
    text = "\n".join(lines(result))
    assert "cannot reach Redis" in text
    assert "password=***" in text
    assert SECRET not in text


def test_the_nats_bridge_never_logs_the_token_of_its_url_while_it_retries():
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")},
        "MAILROOM_NATS__URL": f"nats://{SECRET}@127.0.0.1:{free_port()}",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "mailroom", "bridge", "nats"],
        env=env,
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    watchdog = threading.Timer(60, process.kill)  # readline must not hang the suite
    watchdog.start()
    output: list[str] = []
    try:
        # Two reports of the outage: the first and a retry's.
        while sum("unreachable" in line for line in output) < 2 and process.poll() is None:
            output.append(process.stdout.readline())
        process.send_signal(signal.SIGTERM)
        process.wait(15)
        output.append(process.stdout.read())
    finally:
        watchdog.cancel()
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
    text = "".join(output)
    assert sum("is unreachable" in line for line in output) >= 2, text
    assert "nats://***@127.0.0.1" in text
    assert SECRET not in text
