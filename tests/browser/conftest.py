"""The console in a real browser: headless Chromium (Debian's) driven by Playwright.

One whole system for the browser tests (worker, bridges, scheduler, recognizer and the console
as real processes, on the session's Postgres, Redis, NATS and IMAP servers), an OpenID
Connect provider the console signs people in through (``oidc-provider-mock``), and one
signed-in browser session per person, reused by every test here. Each test works on the
files of its own senders (``mails.py``), so the tests share one queue without meeting.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    Page,
    Playwright,
    expect,
    sync_playwright,
)

from mailroom.db.engine import libpq_dsn
from mailroom.db.migrate import PROJECT_ROOT
from mailroom.devtools.dev import console_spec, dev_child
from mailroom.devtools.imap import ImapServer
from mailroom.devtools.sinks import WebhookSink
from mailroom.devtools.stack import EmbeddedNats, EmbeddedPostgres, EmbeddedRedis, free_port
from mailroom.devtools.supervisor import Child
from mailroom.devtools.system import System, system_env
from tests.browser.console import Console, sign_in
from tests.browser.mails import browser_test_mails
from tests.browser.screenshots import DOCS_IMAGES, Screenshots, write_screenshots_key
from tests.fixtures.dovecot import missing_debian_server
from tests.fixtures.imap import new_folder
from tests.fixtures.services import fresh_database

#: How long an expectation waits for the page to show it, in milliseconds: patience on a
#: loaded machine, not a limit on how fast the console must be.
EXPECT_TIMEOUT_MS = 15_000
expect.set_options(timeout=EXPECT_TIMEOUT_MS)

#: The browser's window: fixed, so pages (and their screenshots) lay out the same each run.
VIEWPORT = {"width": 1280, "height": 800}

#: Who signs in, with the groups the provider gives them (the console's default groups).
OPERATOR = "olivia@mailroom.test"
SECOND_OPERATOR = "oscar@mailroom.test"
VIEWER = "victor@mailroom.test"
PEOPLE = {
    OPERATOR: ["mailroom-operators"],
    SECOND_OPERATOR: ["mailroom-operators"],
    VIEWER: ["mailroom-viewers"],
}


def _chromium(request: pytest.FixtureRequest) -> str:
    """Debian's Chromium: Playwright's own browser download is not used."""
    found = shutil.which("chromium")
    if found is None:
        missing_debian_server(
            request, "Chromium is not installed (apt-get install chromium chromium-driver)"
        )
    return found


# NOTE: package scope, not session: the sync API runs an event loop of its own in this
# thread, and the asyncio tests that run after these in the same process must not meet it.
@pytest.fixture(scope="package")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="package")
def browser(request: pytest.FixtureRequest, playwright: Playwright) -> Iterator[Browser]:
    chromium = playwright.chromium.launch(executable_path=_chromium(request), headless=True)
    yield chromium
    chromium.close()


@pytest.fixture(scope="package")
def oidc_issuer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local OpenID Connect provider (its own process) that knows two operators and a viewer.

    The browser meets it as a person would: the console sends them there, they choose who
    they are on its page, and it sends them back with a code the console redeems.
    """
    port = free_port()
    issuer = f"http://localhost:{port}"
    args = [sys.executable, "-m", "oidc_provider_mock", "--host", "localhost", "--port", str(port)]
    for sub, groups in PEOPLE.items():
        args += ["--user-claims", json.dumps({"sub": sub, "email": sub, "groups": groups})]
    log = tmp_path_factory.mktemp("oidc") / "provider.log"
    provider = Child("oidc-provider", args, {**os.environ, "NO_COLOR": "1"}, log)
    provider.start(PROJECT_ROOT)
    try:
        _wait_for(f"{issuer}/.well-known/openid-configuration", log)
        yield issuer
    finally:
        provider.kill()
        assert provider.process is not None
        provider.process.wait(10)
        provider.close()


def _wait_for(url: str, log: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(
        f"{url} did not answer in {timeout_s}s:\n{log.read_text(errors='replace')}"
    )


@pytest.fixture(scope="package")
def console_system(
    postgres_server: EmbeddedPostgres,
    redis_server: EmbeddedRedis,
    nats_server: EmbeddedNats,
    imap_server: ImapServer,
    oidc_issuer: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Console]:
    """The whole system and its console, on the session's servers."""
    tmp = tmp_path_factory.mktemp("console-system")
    folder = new_folder(imap_server)
    webhook = WebhookSink().start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with fresh_database(postgres_server) as database_url:
        env = system_env(
            database_url=database_url,
            redis_url=redis_server.url,
            nats_url=nats_server.url,
            state_dir=tmp / "state",
            imap=imap_server,
            folder=folder,
            webhook=webhook,
            **console_env(port, url, oidc_issuer),
            # A missing field settles its file at the first attempt: the automatic replay is
            # the pipeline's tests' business, and would double the wait here.
            MAILROOM_RECOGNITION__AUTOMATIC_ATTEMPTS="1",
        )
        logs = tmp / "logs"
        logs.mkdir()
        system = System(env, libpq_dsn(database_url), folder, imap_server, webhook, logs)
        try:
            system.start_all()
            start_console(system)
            console = Console(system, url)
            console.wait_until_up()
            yield console
        finally:
            system.kill_all()
            webhook.stop()
            _flush(redis_server)


@pytest.fixture(scope="package")
def waiting_files(console_system: Console) -> dict[str, list[int]]:
    """Every test's mails sent through the system at once; the ids of their files, by
    sender domain (oldest first), once each was recognized or waits for a person."""
    mails = browser_test_mails()
    console_system.system.append(*[mail for batch in mails.values() for mail in batch])
    found = console_system.wait_for_files(sum(map(len, mails.values())))
    assert {domain: len(ids) for domain, ids in found.items()} == {
        domain: len(batch) for domain, batch in mails.items()
    }
    return found


def start_console(system: System) -> None:
    """``mailroom console`` beside the other processes, as ``mailroom dev`` starts it."""
    name, args = console_spec()
    system.supervisor.add(dev_child(name, args, system.env, system.logs / f"{name}.log"))


def console_env(port: int, url: str, issuer: str) -> dict[str, str]:
    """The console on ``port``, signing people in through ``issuer`` over plain HTTP."""
    return {
        "MAILROOM_CONSOLE__HOST": "127.0.0.1",
        "MAILROOM_CONSOLE__PORT": str(port),
        "MAILROOM_CONSOLE__PUBLIC_URL": url,
        "MAILROOM_CONSOLE__AUTH": "oidc",
        "MAILROOM_CONSOLE__SESSION_SECRET": os.urandom(24).hex(),
        # Loopback over plain HTTP: a Secure cookie would never be sent back.
        "MAILROOM_CONSOLE__SECURE_COOKIES": "false",
        "MAILROOM_CONSOLE__OIDC_ISSUER": issuer,
        # The mock provider takes any client id and secret.
        "MAILROOM_CONSOLE__OIDC_CLIENT_ID": "mailroom-console",
        "MAILROOM_CONSOLE__OIDC_CLIENT_SECRET": "browser-tests",
    }


def _flush(server: EmbeddedRedis) -> None:
    import redis

    client = redis.Redis.from_url(server.url)
    client.flushdb()
    client.close()


def _context(browser: Browser, **options: Any) -> BrowserContext:
    """A fresh browser profile with a fixed window, language and time zone."""
    return browser.new_context(
        viewport=VIEWPORT,  # type: ignore[arg-type]
        device_scale_factor=1,
        locale="en-GB",
        timezone_id="UTC",
        color_scheme="light",
        **options,
    )


def _signed_in_state(browser: Browser, console: Console, who: str) -> Any:
    context = _context(browser)
    try:
        sign_in(context.new_page(), console.url, who)
        return context.storage_state()
    finally:
        context.close()


@pytest.fixture(scope="package")
def operator_state(browser: Browser, console_system: Console) -> Any:
    """The cookies of an operator signed in through the OIDC provider."""
    return _signed_in_state(browser, console_system, OPERATOR)


@pytest.fixture(scope="package")
def second_operator_state(browser: Browser, console_system: Console) -> Any:
    """The cookies of another operator, signed in the same way."""
    return _signed_in_state(browser, console_system, SECOND_OPERATOR)


@pytest.fixture(scope="package")
def viewer_state(browser: Browser, console_system: Console) -> Any:
    """The cookies of a viewer signed in through the OIDC provider."""
    return _signed_in_state(browser, console_system, VIEWER)


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    """A browser profile nobody signed in to."""
    profile = _context(browser)
    yield profile
    profile.close()


def _page(browser: Browser, state: Any) -> Iterator[Page]:
    profile = _context(browser, storage_state=state)
    yield profile.new_page()
    profile.close()


@pytest.fixture
def operator_page(browser: Browser, operator_state: Any) -> Iterator[Page]:
    yield from _page(browser, operator_state)


@pytest.fixture
def second_operator_page(browser: Browser, second_operator_state: Any) -> Iterator[Page]:
    yield from _page(browser, second_operator_state)


@pytest.fixture
def viewer_page(browser: Browser, viewer_state: Any) -> Iterator[Page]:
    yield from _page(browser, viewer_state)


@pytest.fixture
def screenshots(request: pytest.FixtureRequest, tmp_path: Path) -> Screenshots:
    """The docs' images with ``MAILROOM_WRITE_SCREENSHOTS=1``, else this test's folder."""
    if request.config.stash.get(write_screenshots_key, False):
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        return Screenshots(DOCS_IMAGES)
    return Screenshots(tmp_path)
