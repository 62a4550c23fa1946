"""Every process starts through an import: what it does not use, it must not import.

Each process of a deployment imports before its own work (``mailroom worker`` the CLI and
its settings, then Dramatiq's main, then ``actors`` in each worker process); a library
imported there for nothing costs every start (e.g. SQLAlchemy about 0.35 s of CPU). Checked
in a fresh interpreter by which modules got loaded, not by timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

#: Libraries that only some commands or settings need.
_OPERATOR_LIBRARIES = {
    "sqlalchemy",
    "psycopg",
    "redis",
    "nats",
    "httpx",
    "aiohttp",
    "rich",
    "dramatiq",
}


def _loaded_modules(code: str) -> set[str]:
    """Every module loaded after running ``code`` in a fresh interpreter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    result = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


def _output(code: str) -> str:
    """The last line ``code`` prints in a fresh interpreter, whatever it exits with."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip(), result.stderr[-2000:]
    return result.stdout.strip().splitlines()[-1]


def _loaded(code: str) -> set[str]:
    """The top-level packages loaded after running ``code``."""
    return {name.split(".")[0] for name in _loaded_modules(code)}


def test_the_settings_load_without_the_database_libraries():
    loaded = _loaded("from mailroom.settings import Settings; Settings()")
    assert "pydantic_settings" in loaded
    assert loaded & {"sqlalchemy", "psycopg", "redis", "nats"} == set()


def test_mailroom_worker_runs_dramatiq_in_its_own_process_without_the_operator_commands():
    # What ``python -m mailroom worker`` loads up to Dramatiq's main, which it calls in the same
    # process (no exec: a fresh interpreter imported pydantic and the settings again).
    loaded = _loaded(
        "import sys\n"
        "import mailroom.process.dramatiq_main as entry\n"
        "def main(argv, settings):\n"
        "    return 0 if argv[:1] == ['actors'] and '--queues' in argv else 3\n"
        "entry.main = main\n"
        "sys.argv = ['mailroom', 'worker', '-Q', 'intake']\n"
        "from mailroom.cli import app\n"
        "try:\n"
        "    app(prog_name='mailroom')\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code"
    )
    assert "typer" in loaded
    # dramatiq: mailroom.process.dramatiq_main's own import; psycopg and redis: the check of
    # the Postgres and broker logins before the workers start (mailroom.process.logins).
    assert loaded & _OPERATOR_LIBRARIES == {"dramatiq", "psycopg", "redis"}


def test_an_operator_command_is_still_found_and_run():
    # ``intake`` is loaded only when named: its module, then its command's own imports.
    loaded = _loaded(
        "import sys\n"
        "from mailroom.cli import app\n"
        "sys.argv = ['mailroom', 'intake', '--help']\n"
        "try:\n"
        "    app(prog_name='mailroom')\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code"
    )
    assert {"rich", "sqlalchemy"} <= loaded


def test_worker_processes_without_a_sentry_dsn_or_oauth_never_import_sentry_or_httpx():
    # ``import actors`` is what each Dramatiq worker process runs; the stub broker keeps it
    # from reaching a Redis server. Delivery's webhook channel imports aiohttp when it sends,
    # and nats-py's websocket transport when a ``ws://`` link uses it (adapters/nats/websocket).
    loaded = _loaded(
        "import os; os.environ['MAILROOM_BROKER__KIND'] = 'stub'\n"
        "import actors, scheduling.runner, bridges.nats, bridges.stream"
    )
    assert {"dramatiq", "sqlalchemy", "nats"} <= loaded
    unused = {"sentry_sdk", "httpx", "aiohttp", "multidict", "click", "rich", "typer", "boto3"}
    assert loaded & {*unused, "botocore"} == set()


def test_nats_websocket_links_import_aiohttp_when_they_connect():
    output = _output(
        "import sys\n"
        "from mailroom.adapters.nats.websocket import import_nats\n"
        "import_nats()\n"
        "import nats.aio.transport as transport\n"
        "before = 'aiohttp' in sys.modules\n"
        "import aiohttp, multidict\n"
        "assert transport.aiohttp.ClientSession is aiohttp.ClientSession\n"
        "assert transport.multidict.CIMultiDict is multidict.CIMultiDict\n"
        "print(before, transport.aiohttp is aiohttp)"
    )
    assert output == "False True"


def test_the_worker_main_shares_the_webhook_client_only_with_delivery_workers():
    code = (
        "from mailroom.process.dramatiq_main import import_shared_modules\n"
        "import_shared_modules({queues!r})"
    )
    assert "aiohttp" not in _loaded(code.format(queues=["intake"]))
    assert "aiohttp" in _loaded(code.format(queues=["inbox", "delivery"]))


def test_the_channels_import_their_http_clients_when_they_send():
    loaded = _loaded("import mailroom.adapters.channels, mailroom.adapters.channels.webhook")
    assert loaded & {"aiohttp", "yarl", "httpx"} == set()


def test_dramatiq_main_shares_only_inert_modules_with_its_worker_processes():
    # Imported before the fork: nothing may start a thread or register a metric there.
    loaded = _loaded(
        "import threading\n"
        "from mailroom.process.dramatiq_main import import_shared_modules\n"
        "import_shared_modules()\n"
        "assert threading.active_count() == 1, threading.enumerate()"
    )
    assert {"sqlalchemy", "psycopg", "redis", "nats"} <= loaded
    assert loaded & {"prometheus_client", "sentry_sdk", "actors"} == set()


#: Actor modules, and what only they need: a process that only sends by name loads none.
_ACTOR_MODULES = {
    "actors.broker.build",
    "actors.middleware.resources",
    "actors.intake",
    "actors.recognition",
    "actors.notifications",
    "actors.delivery",
    "actors.retention",
    "actors.system",
    "mailroom.db.models",
}

#: Each sender's ``run`` up to its loop, which is replaced by one that returns at once.
_SENDERS = {
    "bridge nats": (
        "import bridges.nats as bridge\n"
        "async def loop(settings, send):\n"
        "    return 0\n"
        "bridge._main = loop\n"
        "assert bridge.run(settings) == 0"
    ),
    "bridge stream": (
        "import bridges.stream as bridge\n"
        "async def loop(settings, send):\n"
        "    return 0\n"
        "bridge.serve = loop\n"
        "assert bridge.run(settings) == 0"
    ),
    "scheduler": (
        "import scheduling.runner as runner\n"
        "from scheduling.jobs import job_table\n"
        "runner.SchedulerService.run = lambda self: job_table(self.settings)\n"
        "assert runner.run(settings) == 0"
    ),
}


def test_the_bridges_and_the_scheduler_send_by_name_without_loading_the_actors():
    for name, code in _SENDERS.items():
        # The Redis broker's class, as in production: building it connects to nothing.
        modules = _loaded_modules(
            "from mailroom.settings import Settings\n"
            "settings = Settings()\n"
            f"{code}\n"
            "import dramatiq\n"
            "assert type(dramatiq.get_broker()).__name__ == 'WakingRedisBroker'"
        )
        assert "actors.broker.transport" in modules, name
        assert modules & _ACTOR_MODULES == set(), name
        assert "aiohttp" not in modules, name
    # The scheduler connects with psycopg alone (mailroom.db.dsn): no SQLAlchemy.
    assert "sqlalchemy" not in _loaded(
        f"from mailroom.settings import Settings\nsettings = Settings()\n{_SENDERS['scheduler']}"
    )


def test_the_recognizer_command_loads_neither_aiohttp_nor_rich():
    # Its service's ``run`` replaced by a report of what the command imported before it.
    loaded = _loaded(
        "import sys\n"
        "import mailroom.cli as cli\n"
        "def start_service(process):\n"
        "    import mailroom.recognizer.serve\n"
        "    sys.exit(0)\n"
        "cli.start_service = start_service\n"
        "try:\n"
        "    cli.app(['recognizer'], prog_name='mailroom')\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code"
    )
    assert "nats" in loaded
    assert loaded & {"aiohttp", "rich", "sqlalchemy"} == set()


#: Each long-running process's entry, its work replaced by printing the collector's thresholds.
_SERVICES = {
    "bridge nats": ("bridges.nats", "run", ["bridge", "nats"]),
    "bridge stream": ("bridges.stream", "run", ["bridge", "stream"]),
    "bridge imap": ("bridges.imap", "run", ["bridge", "imap"]),
    "scheduler": ("scheduling.runner", "run", ["scheduler"]),
    "recognizer": ("mailroom.recognizer.serve", "run", ["recognizer"]),
}


def test_long_running_processes_collect_garbage_rarely():
    from mailroom.process import gc_policy

    tuned = f"{(gc_policy.YOUNG_THRESHOLD, *gc_policy.OLDER_THRESHOLDS)}"
    for name, (module, function, argv) in _SERVICES.items():
        code = (
            "import gc, importlib\n"
            f"target = importlib.import_module({module!r})\n"
            f"setattr(target, {function!r}, lambda settings: print(gc.get_threshold()) or 0)\n"
            "from mailroom.cli import app\n"
            f"app({argv!r}, prog_name='mailroom')\n"
        )
        assert _output(code) == tuned, name
    worker_main = (
        "import gc, mailroom.process.dramatiq_main as entry\n"
        "entry.import_shared_modules = lambda queues: None\n"
        "entry.dramatiq_main = lambda args: print(gc.get_threshold()) or 0\n"
        "entry.main(['actors'])\n"
    )
    assert _output(worker_main) == tuned
