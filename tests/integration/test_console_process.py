"""``mailroom console`` as a process: it serves the pages on its port, its metrics beside them,
signs in over real HTTP, and refuses settings that would leave it open."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from mailroom.db.migrate import PROJECT_ROOT
from tests.fixtures.console import console_process, csrf_of

pytestmark = pytest.mark.integration


@pytest.fixture
def recognition_settings(console_settings):
    return console_settings


async def test_the_console_process_serves_pages_and_metrics(console_settings, review_seed):
    ref = await review_seed.document(fields={"amount": (500, 0.99)}, subject="Served for real")
    with console_process(console_settings) as running:
        with httpx.Client(base_url=running.url, follow_redirects=True) as browser:
            page = browser.get("/signin")
            done = browser.post(
                "/signin", data={"csrf": csrf_of(page.text), "name": "ana", "role": "operator"}
            )
            assert done.url.path == "/review" and "Served for real" in done.text
            cookie = done.history[0].headers["set-cookie"]
            assert "httponly" in cookie.lower() and "samesite=lax" in cookie.lower()
            document = browser.get(f"/files/{ref.file_id}")
            assert "Served for real" in document.text
            assert "script-src 'self'" in document.headers["content-security-policy"]
        metrics = httpx.get(running.metrics_url).text
        assert 'mailroom_console_sign_ins_total{outcome="signed_in"} 1.0' in metrics


def test_dev_sign_in_is_refused_outside_mailroom_dev(database_url):
    done = subprocess.run(
        [sys.executable, "-m", "mailroom", "console"],
        env={"MAILROOM_CONSOLE__AUTH": "dev", "MAILROOM_DATABASE__URL": database_url, "PATH": ""},
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "mailroom console: cannot start: console.auth is dev (sign-in without a password), "
        "which only `mailroom dev` allows; set MAILROOM_CONSOLE__AUTH to oidc or proxy"
    ]
