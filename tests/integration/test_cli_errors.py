"""A wrong setting, an unreachable server or a refused login is a line or two, not a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mailroom.db.migrate import PROJECT_ROOT
from mailroom.devtools.stack import EmbeddedPostgres, free_port

pytestmark = pytest.mark.integration


def mailroom(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``mailroom ARGS`` with this environment minus MAILROOM_* plus ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    return subprocess.run(
        [sys.executable, "-m", "mailroom", *args],
        env={**clean, **env},
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return (result.stdout + result.stderr).splitlines()


def test_misspelt_mailbox_key_is_one_line_naming_it_and_exit_2():
    mailbox = {"name": "x", "host": "h", "pasword": "p"}
    result = mailroom("status", MAILROOM_INTAKE__MAILBOXES=json.dumps([mailbox]))
    assert result.returncode == 2
    (line,) = lines(result)
    assert "pasword" in line
    assert "MAILROOM_INTAKE__MAILBOXES" in line


def test_unreachable_database_is_at_most_three_lines_and_exit_1():
    url = f"postgresql+psycopg://nobody:s3cret@127.0.0.1:{free_port()}/x"
    result = mailroom("status", MAILROOM_DATABASE__URL=url)
    assert result.returncode == 1
    output = lines(result)
    assert 1 <= len(output) <= 3, output
    text = "\n".join(output)
    assert "Traceback" not in text
    assert "cannot reach Postgres" in text
    assert "MAILROOM_DATABASE__URL" in text
    assert "s3cret" not in text


def test_unreachable_redis_for_dead_letters_is_two_lines():
    result = mailroom(
        "dead-letters", "list", MAILROOM_REDIS__URL=f"redis://127.0.0.1:{free_port()}/0"
    )
    assert result.returncode == 1
    output = lines(result)
    assert len(output) <= 3, output
    assert "cannot reach Redis" in output[0]
    assert "Traceback" not in "\n".join(output)


def test_refused_database_login_says_so(postgres_server: EmbeddedPostgres):
    url = f"postgresql+psycopg://no_such_role@127.0.0.1:{postgres_server.port}/postgres"
    result = mailroom("intake", "status", MAILROOM_DATABASE__URL=url)
    assert result.returncode == 1
    output = lines(result)
    assert len(output) <= 3, output
    assert "Postgres refused the login" in output[0]
    assert "no_such_role" in output[0]


def test_debug_shows_the_traceback():
    result = mailroom("--debug", "status", MAILROOM_INTAKE__MAILBOXES="notjson")
    assert result.returncode != 0
    assert "Traceback" in result.stderr or "InvalidJsonSettingError" in result.stderr
    assert "MAILROOM_INTAKE__MAILBOXES" in result.stderr
