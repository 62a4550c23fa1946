"""docker-compose.yml and the Dockerfile agree with the code and with the images they run.

There is no Docker engine here: these checks read the files. Every Mailroom service runs a
command the CLI has, with settings the Settings class loads; every host and port a process
reaches is a service of the stack on a port its image documents; every healthcheck asks the
port the process serves; every service restarts.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import typer.main
import yaml

from actors.queues import ALL as QUEUES
from actors.queues import INTAKE
from mailroom.cli import app
from mailroom.settings import Settings
from mailroom.settings.reference import env_names

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"

#: Ports each image documents (Docker Hub pages and their Dockerfiles' EXPOSE), by image name.
IMAGE_PORTS = {
    "postgres": {"postgres": 5432},
    "redis": {"redis": 6379},
    "nats": {"client": 4222, "monitoring": 8222},
    "minio/minio": {"s3": 9000},
}
#: GreenMail's standard ports; ``-Dgreenmail.setup.test.*`` adds 3000 to each.
GREENMAIL_PORTS = {"smtp": 25, "pop3": 110, "imap": 143, "smtps": 465, "imaps": 993, "pop3s": 995}
#: Services that run once and are done: their dependents wait for them to complete.
ONE_SHOT = {"migrate", "nats-setup"}
#: What a Mailroom process healthcheck runs: a GET of its metrics endpoint on loopback.
HEALTH_URL = re.compile(r"urlopen\('http://127\.0\.0\.1:(\d+)/metrics'")


def _services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def _image(service: dict) -> str:
    return str(service.get("image", "")).rsplit(":", 1)[0]


def _mailroom_services() -> dict[str, dict]:
    return {name: s for name, s in _services().items() if "build" in s}


def _service_for_image(image: str) -> str:
    found = [name for name, s in _services().items() if _image(s) == image]
    assert len(found) == 1, f"one service runs {image}: {found}"
    return found[0]


def _greenmail_ports(opts: str) -> dict[str, int]:
    offset = 3000 if "-Dgreenmail.setup.test." in opts else 0
    return {name: port + offset for name, port in GREENMAIL_PORTS.items()}


def _greenmail_logins(opts: str) -> dict[str, str]:
    """Login -> password of the users GREENMAIL_OPTS creates (``login:password@domain``)."""
    users = re.search(r"-Dgreenmail\.users=(\S+)", opts)
    by_email = "-Dgreenmail.users.login=email" in opts
    logins = {}
    for user in users.group(1).split(",") if users else []:
        login, _, rest = user.partition(":")
        password, _, domain = rest.partition("@")
        logins[f"{login}@{domain}" if by_email and domain else login] = password
    return logins


def _is_group(command: object) -> bool:
    # Typer ships its own copy of click: recognise groups by what they can do.
    return hasattr(command, "list_commands")


def _mailroom_command_exists(words: list[str]) -> bool:
    """Whether ``mailroom WORDS…`` names a command and its options parse."""
    command = typer.main.get_command(app)
    while _is_group(command) and words and not words[0].startswith("-"):
        command = command.get_command(command.context_class(command), words[0])
        if command is None:
            return False
        words = words[1:]
    # A group runs by itself only when it says so (`mailroom recognizer`, beside its `check`).
    if _is_group(command) and not command.invoke_without_command:
        return False
    try:
        context = command.make_context("mailroom", list(words))
    except Exception:  # click's usage errors: an unknown option or a bad value
        return False
    # `worker` passes unknown options on to Dramatiq: in compose there must be none.
    return not context.args


def _worker_queues(command: list[str]) -> list[str]:
    """The queues of ``mailroom worker -Q A -Q B …``."""
    return [command[i + 1] for i, word in enumerate(command) if word in ("-Q", "--queues")]


@pytest.fixture
def settings_of(monkeypatch):
    """The Settings a Mailroom service loads from its compose environment."""

    def load(service: dict) -> Settings:
        for name in [n for n in os.environ if n.startswith("MAILROOM_")]:
            monkeypatch.delenv(name)
        image_env = dict(re.findall(r"(MAILROOM_\w+)=(\S+)", DOCKERFILE.read_text()))
        for name, value in {**image_env, **service["environment"]}.items():
            monkeypatch.setenv(name, str(value))
        return Settings()

    return load


def test_every_part_of_the_system_has_a_service():
    services = _services()
    assert {"postgres", "redis", "nats", "minio", "mail", "migrate", "nats-setup"} <= set(services)
    commands = [s["command"] for s in _mailroom_services().values()]
    for process in (
        ["bridge", "nats"],
        ["bridge", "stream"],
        ["bridge", "imap"],
        ["scheduler"],
        ["recognizer"],
        ["console"],
    ):
        assert process in commands, f"no service runs mailroom {' '.join(process)}"
    queues = [_worker_queues(c) for c in commands if c[0] == "worker"]
    assert all(len(q) == 1 for q in queues), "one worker service per queue"
    assert sorted(q[0] for q in queues) == sorted(QUEUES), "every queue needs its worker service"
    assert "--appendonly" in services["redis"]["command"]
    assert "-js" in services["nats"]["command"]


def test_nats_is_set_up_by_the_administrator_and_the_processes_cannot_change_it(settings_of):
    services = _services()
    setup = services["nats-setup"]
    assert setup["command"] == ["nats", "setup"]
    assert settings_of(setup).nats.user == "mailroom-admin"
    for name, service in _mailroom_services().items():
        if name in ONE_SHOT:
            continue
        nats = settings_of(service).nats
        assert nats.user in ("mailroom", "recognizer"), f"{name}: logs in as {nats.user!r}"
        assert not nats.manage_stream, f"{name}: may create or change the stream"
        assert "nats-setup" in service["depends_on"], f"{name}: starts before nats setup"


def test_every_mailroom_command_exists_and_every_variable_is_a_setting():
    known = env_names()
    for name, service in _mailroom_services().items():
        command = service["command"]
        assert _mailroom_command_exists(command), f"{name}: `mailroom {' '.join(command)}` unknown"
        if command[0] == "worker":
            for flag in ("--processes", "--threads"):
                assert flag in command, f"{name}: set {flag} per queue"
        for variable in service["environment"]:
            assert variable.startswith("MAILROOM_"), f"{name}: {variable} is not Mailroom's"
            assert variable in known, f"{name}: {variable} is not a setting"


def test_the_checker_rejects_unknown_commands():
    assert not _mailroom_command_exists(["bridge", "kafka"])
    assert not _mailroom_command_exists(["bridge"])
    assert not _mailroom_command_exists(["worker", "--queue", "intake"])
    assert not _mailroom_command_exists(["scheduler", "--threads", "2"])
    assert _mailroom_command_exists(["bridge", "nats"])
    assert _mailroom_command_exists(["worker", "-Q", "intake", "--processes", "1"])


def test_servers_are_reached_where_their_images_listen(settings_of):
    services = _services()
    postgres = services[_service_for_image("postgres")]
    minio = services[_service_for_image("minio/minio")]
    mail_name = _service_for_image("greenmail/standalone")
    opts = services[mail_name]["environment"]["GREENMAIL_OPTS"]
    mail_ports, logins = _greenmail_ports(opts), _greenmail_logins(opts)
    for name, service in _mailroom_services().items():
        settings = settings_of(service)
        database = urlsplit(settings.database.url)
        assert (database.hostname, database.port) == (_service_for_image("postgres"), 5432)
        assert (database.username, database.password, database.path) == (
            postgres["environment"]["POSTGRES_USER"],
            postgres["environment"]["POSTGRES_PASSWORD"],
            "/" + postgres["environment"]["POSTGRES_DB"],
        ), f"{name}: database credentials differ from the postgres service"
        for url, image, port in (
            (settings.redis.url, "redis", "redis"),
            (settings.broker_redis_url, "redis", "redis"),
            (settings.nats.url, "nats", "client"),
            (settings.storage.s3_endpoint_url, "minio/minio", "s3"),
        ):
            parts = urlsplit(url or "")
            expected = (_service_for_image(image), IMAGE_PORTS[image][port])
            assert (parts.hostname, parts.port) == expected, f"{name}: {url}"
        assert settings.storage.kind == "s3"
        assert settings.storage.s3_access_key == minio["environment"]["MINIO_ROOT_USER"]
        assert (
            settings.storage.s3_secret_key.get_secret_value()
            == minio["environment"]["MINIO_ROOT_PASSWORD"]
        )
        assert settings.nats.jetstream == ("-js" in services["nats"]["command"])
        assert settings.intake.mailboxes, f"{name}: no mailbox to read"
        for mailbox in settings.intake.mailboxes:
            # GreenMail's test setup has no STARTTLS on its plain ports: TLS is on imaps.
            assert (mailbox.host, mailbox.port, mailbox.security) == (
                mail_name,
                mail_ports["imap"],
                "plain",
            ), f"{name}: mailbox {mailbox.name}"
            assert logins.get(mailbox.username) == mailbox.password.get_secret_value(), (
                f"{name}: GreenMail has no login {mailbox.username} with that password"
            )
        for account_name, account in settings.delivery.email_accounts.items():
            assert (account.host, account.port, account.security) == (
                mail_name,
                mail_ports["smtp"],
                "plain",
            ), f"{name}: e-mail account {account_name}"


def _depends(services: dict, name: str) -> set[str]:
    """Every service ``name`` waits for, directly or through another."""
    found: set[str] = set()
    todo = [name]
    while todo:
        for dependency in services[todo.pop()].get("depends_on") or {}:
            if dependency not in found:
                found.add(dependency)
                todo.append(dependency)
    return found


def test_processes_wait_for_what_they_reach(settings_of):
    services = _services()
    for name, service in _mailroom_services().items():
        settings = settings_of(service)
        hosts = {
            urlsplit(settings.database.url).hostname,
            urlsplit(settings.storage.s3_endpoint_url or "").hostname,
        }
        if name == "nats-setup":  # reaches NATS only
            hosts = {urlsplit(settings.nats.url).hostname}
        elif name not in ONE_SHOT:  # migrate reaches the database and the buckets only
            urls = [settings.redis.url, settings.nats.url]
            hosts |= {urlsplit(url or "").hostname for url in urls}
            hosts |= {m.host for m in settings.intake.mailboxes}
            hosts |= {a.host for a in settings.delivery.email_accounts.values()}
        assert hosts <= _depends(services, name), f"{name}: starts before {hosts}"
        for dependency, condition in (service.get("depends_on") or {}).items():
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency}: no healthcheck"
            if condition["condition"] == "service_completed_successfully":
                assert dependency in ONE_SHOT


def test_every_mailroom_process_has_a_healthcheck_on_its_metrics_port(settings_of):
    for name, service in _mailroom_services().items():
        if name in ONE_SHOT:
            assert "healthcheck" not in service, f"{name}: a one-shot job is never healthy"
            continue
        test = service["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"], f"{name}: the image has python, not curl"
        match = HEALTH_URL.search(test[3])
        assert match, f"{name}: healthcheck does not ask a metrics endpoint: {test}"
        port = int(match.group(1))
        settings = settings_of(service)
        if service["command"][0] == "worker":
            broker = settings.broker
            assert broker.prometheus, f"{name}: Dramatiq's exporter is off"
            assert (broker.prometheus_host, broker.prometheus_port) == ("0.0.0.0", port), name
        else:
            metrics = settings.metrics
            assert (metrics.host, metrics.port) == ("0.0.0.0", port), name
    nats = _services()["nats"]
    assert f":{IMAGE_PORTS['nats']['monitoring']}/" in " ".join(nats["healthcheck"]["test"])
    assert str(IMAGE_PORTS["nats"]["monitoring"]) in nats["command"]


def _option(command: list[str], *names: str) -> int:
    found = [command[i + 1] for i, word in enumerate(command) if word in names]
    assert len(found) == 1, f"{command} sets {names[0]} once"
    return int(found[0])


#: Connections the scheduler holds (its leader lock, and a short one per check), and those
#: kept free for operators' commands (``mailroom status``, ``replay``…) and the migration.
SCHEDULER_CONNECTIONS = 2
OPERATOR_CONNECTIONS = 10
#: Connections Postgres keeps for superusers (its default ``superuser_reserved_connections``).
RESERVED_CONNECTIONS = 3


def test_postgres_admits_every_connection_the_stack_can_open(settings_of):
    from actors.middleware.resources import pooled
    from mailroom.db.engine import create_engine

    services = _services()
    postgres = services[_service_for_image("postgres")]
    limit = re.search(r"max_connections=(\d+)", " ".join(postgres.get("command", [])))
    max_connections = int(limit.group(1)) if limit else 100  # the image's default
    opened = SCHEDULER_CONNECTIONS + OPERATOR_CONNECTIONS
    for service in _mailroom_services().values():
        command = service["command"]
        if command == ["bridge", "imap"]:  # the watcher's own small pool
            from bridges.imap import POOL_SIZE

            database = settings_of(service).database.model_copy(update={"pool_size": POOL_SIZE})
            pool = create_engine(database).sync_engine.pool
            opened += pool.size() + pool._max_overflow  # type: ignore[attr-defined]
            continue
        if command == ["console"]:  # one engine of the settings' pool for the process
            pool = create_engine(settings_of(service).database).sync_engine.pool
            opened += pool.size() + pool._max_overflow  # type: ignore[attr-defined]
            continue
        if command[0] != "worker":
            continue
        threads = _option(command, "--threads", "-t")
        database = pooled(settings_of(service).database, threads)
        # The engine the worker builds: its pool keeps pool_size and opens up to the overflow.
        engine = create_engine(database).sync_engine
        per_process = engine.pool.size() + engine.pool._max_overflow  # type: ignore[attr-defined]
        opened += _option(command, "--processes", "-p") * per_process
    assert opened <= max_connections - RESERVED_CONNECTIONS, (
        f"the stack can open {opened} Postgres connections; max_connections is {max_connections}"
    )


def test_only_the_stages_after_intake_yield_the_cpu():
    """As ``mailroom dev`` runs them (``PROCESS_NICE``, nice 10: CFS weight 110 against 1024)."""
    for name, service in _mailroom_services().items():
        command = service["command"]
        downstream = (
            (command[0] == "worker" and _worker_queues(command) != [INTAKE])
            or (command[0] == "bridge" and command != ["bridge", "imap"])
            or command[0] == "recognizer"
        )
        expected = 110 if downstream else None
        assert service.get("cpu_shares") == expected, (
            f"{name}: cpu_shares {service.get('cpu_shares')}"
        )


def test_every_service_restarts():
    for name, service in _services().items():
        expected = "on-failure" if name in ONE_SHOT else "unless-stopped"
        assert service.get("restart") == expected, f"{name}: restart {service.get('restart')}"


def test_the_image_is_the_production_install_run_as_a_user():
    text = DOCKERFILE.read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert len(stages) == 2, "a builder stage and a runtime stage"
    builder, runtime = stages
    assert "uv sync --locked --no-dev" in builder and "--no-editable" in builder
    assert runtime.startswith("python:3.11-slim")
    assert re.findall(r"^COPY .*", runtime, flags=re.M) == [
        "COPY --from=builder /app/.venv /app/.venv"
    ], "the runtime holds the venv only"
    user = re.findall(r"^USER (\S+)", runtime, flags=re.M)
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert 'ENTRYPOINT ["mailroom"]' in runtime
    for variable in re.findall(r"(MAILROOM_\w+)=", runtime):
        assert variable in env_names(), f"Dockerfile: {variable} is not a setting"
    for service in _mailroom_services().values():
        assert service["build"] == "." and service["image"] == "mailroom:local"


def test_the_sentinel_override_gives_every_mailroom_process_the_sentinels():
    override = yaml.safe_load((ROOT / "docker-compose.sentinel.yml").read_text())
    known = env_names()
    services = override["services"]
    sentinels = {name for name in services if name.startswith("sentinel-")}
    for name in _mailroom_services():
        environment = services[name]["environment"]
        assert set(environment) <= known, f"{name}: {set(environment) - known} not settings"
        addresses = json.loads(environment["MAILROOM_REDIS__SENTINELS"])
        assert {address.split(":")[0] for address in addresses} == sentinels
        assert environment["MAILROOM_REDIS__SENTINEL_MASTER"] == "mailroom"
    for name in sentinels:
        assert "sentinel monitor mailroom redis 6379 2" in " ".join(services[name]["entrypoint"])


def test_the_console_starts_with_its_compose_settings_and_listens_for_the_published_port(
    settings_of,
):
    from mailroom.cli.console import startup_problem

    service = _services()["console"]
    console = settings_of(service).console
    assert startup_problem(console) is None
    assert (console.host, console.auth, console.secure_cookies) == ("0.0.0.0", "oidc", True)
    assert service["ports"] == [f"{console.port}:{console.port}"]
