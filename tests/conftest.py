"""Test harness: the StubBroker is set up before any actors module is imported.

Fixture modules under ``tests/fixtures/`` are loaded as plugins, so each part of
the system can bring its own servers without editing this file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.brokers.stub import StubBroker
from dramatiq.worker import _WorkerMiddleware

#: CI's switch (``tests/fixtures/dovecot.py``), read before the loop below drops it with every
#: other ``MAILROOM_*`` variable: a missing Dovecot or Debian redis-server fails its tests
#: instead of skipping them.
_require_debian_servers = os.environ.get("MAILROOM_TEST_REQUIRE_DEBIAN_SERVERS") == "1"
#: The browser tests' switch (``tests/browser/screenshots.py``): their screenshots go into the
#: docs' images instead of a temporary folder.
_write_screenshots = os.environ.get("MAILROOM_WRITE_SCREENSHOTS") == "1"

# Stray MAILROOM_* variables from a developer's shell must not leak into tests.
for _name in [n for n in os.environ if n.startswith("MAILROOM_")]:
    del os.environ[_name]

# ``import actors`` builds the broker from settings: make it the StubBroker.
os.environ["MAILROOM_BROKER__KIND"] = "stub"
import actors  # noqa: E402,F401

pytest_plugins = sorted(
    f"tests.fixtures.{path.stem}"
    for path in (Path(__file__).parent / "fixtures").glob("*.py")
    if not path.stem.startswith("_")
)

#: The one StubBroker of the test session, with every actor declared on it.
broker = dramatiq.get_broker()


# The hooks import the fixture module when they run: imported here, before pytest loads it as
# a plugin, its asserts would not be rewritten.


def pytest_configure(config: pytest.Config) -> None:
    from tests.browser.screenshots import write_screenshots_key
    from tests.fixtures.dovecot import require_debian_servers_key

    config.stash[require_debian_servers_key] = _require_debian_servers
    config.stash[write_screenshots_key] = _write_screenshots


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Name the IMAP servers the intake contract runs on."""
    from mailroom.devtools.dovecot import dovecot_version, find_dovecot
    from tests.fixtures.dovecot import REQUIRE_DEBIAN_SERVERS_ENV

    dovecot = find_dovecot()
    if dovecot is None:
        found = "not installed, its tests are skipped (apt-get install dovecot-imapd)"
        if _require_debian_servers:
            found = f"not installed, and {REQUIRE_DEBIAN_SERVERS_ENV}=1: its tests fail"
    else:
        found = f"{dovecot_version(dovecot)} ({dovecot})"
    from tests.fixtures.links import DEBIAN_REDIS

    redis_tls = "found" if DEBIAN_REDIS.exists() else "not installed, its TLS tests are skipped"
    return [f"IMAP servers: pymap; Dovecot {found}", f"Debian's redis-server (TLS): {redis_tls}"]


#: Folders whose tests run whole Mailroom systems (several processes and servers each).
_SYSTEM_TESTS = ("faults", "e2e", "cluster", "browser")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the whole-system tests in one xdist group: one process runs them one at a time.

    Two of them at once on two cores would starve each other's heartbeats and leases; the
    lighter tests run beside them in the other process.
    """
    tests = Path(__file__).parent
    for item in items:
        if item.path.relative_to(tests).parts[0] in _SYSTEM_TESTS:
            item.add_marker(pytest.mark.xdist_group("systems"))


@pytest.fixture(autouse=True)
def _detach_stopped_workers() -> Iterator[None]:
    """Forget the workers a test started once it is over.

    Each ``Worker`` hooks itself into the broker and is never unhooked: a stopped
    worker would still start consumers for queues declared later and swallow their
    messages. Autouse fixtures are torn down last, after the workers stopped.
    """
    yield
    broker.middleware[:] = [m for m in broker.middleware if not isinstance(m, _WorkerMiddleware)]


@pytest.fixture
def stub_broker() -> StubBroker:
    assert isinstance(broker, StubBroker)
    broker.flush_all()
    forget_taken_messages(broker)
    return broker


def forget_taken_messages(stub: StubBroker) -> None:
    """Clear what the queues still count as taken but never acked.

    A worker that stops drops the messages its consumers had taken but not run (the
    StubBroker's consumer cannot requeue them), and each stays counted as unfinished
    in its queue: a later test's ``join`` on that queue then waited for it forever.
    """
    for queue in stub.queues.values():  # the delay queues too
        with queue.all_tasks_done:
            queue.unfinished_tasks = 0
            queue.all_tasks_done.notify_all()


@pytest.fixture
def stub_worker(stub_broker: StubBroker) -> Iterator[Worker]:
    worker = Worker(stub_broker, worker_timeout=100)
    worker.start()
    yield worker
    worker.stop()


@pytest.fixture
def intake_worker(settings: object, stub_broker: StubBroker) -> Iterator[Worker]:
    """A worker on the intake queue only, once the module's ``settings`` fixture configured
    the actors' resources: the other queues are someone else's to run."""
    worker = Worker(stub_broker, worker_timeout=100, queues={"intake"})
    worker.start()
    yield worker
    worker.stop()
