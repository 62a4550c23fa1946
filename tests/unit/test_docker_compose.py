"""docker-compose.yml only runs commands that exist and passes settings the class knows."""

from __future__ import annotations

from pathlib import Path

import typer.main
import yaml

from actors.queues import ALL as QUEUES
from mailroom.cli import app
from mailroom.settings_reference import env_names

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
REQUIRED = {
    "postgres",
    "redis",
    "nats",
    "minio",
    "mail",
    "migrate",
    "bridge-nats",
    "bridge-stream",
    "scheduler",
    "recognizer",
}


def _services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def _is_group(command: object) -> bool:
    # Typer ships its own copy of click: recognise groups by what they can do.
    return hasattr(command, "list_commands")


def _mailroom_command_exists(words: list[str]) -> bool:
    command = typer.main.get_command(app)
    for word in words:
        if word.startswith("-"):
            break
        if not _is_group(command):
            return False
        sub = command.get_command(command.context_class(command), word)
        if sub is None:
            return False
        command = sub
    return not _is_group(command)


def _worker_queues(command: list[str]) -> list[str]:
    """The queues of ``mailroom worker -Q A -Q B …``."""
    return [command[i + 1] for i, word in enumerate(command) if word in ("-Q", "--queues")]


def _check_command(name: str, command: list[str]) -> None:
    assert command[:3] == ["uv", "run", "--no-dev"], f"{name}: run through uv"
    program, words = command[3], command[4:]
    # Workers too go through `mailroom worker`: it sets up Dramatiq's Prometheus exporter.
    assert program == "mailroom", f"{name}: unexpected program {program}"
    assert _mailroom_command_exists(words), f"{name}: `mailroom {' '.join(words)}` unknown"
    if words[0] == "worker":
        queues = _worker_queues(words)
        assert queues and set(queues) <= set(QUEUES), f"{name}: unknown queue in {queues}"
        for flag in ("--processes", "--threads"):
            assert flag in words, f"{name}: set {flag} per queue"


def test_every_part_of_the_system_has_a_service():
    services = _services()
    assert set(services) >= REQUIRED
    workers = [s for s in services if s.startswith("worker-")]
    consumed = set()
    for worker in workers:
        consumed |= set(_worker_queues(services[worker]["command"]))
    assert consumed == set(QUEUES), "every queue needs a worker service"
    assert "--appendonly" in services["redis"]["command"]
    assert "-js" in services["nats"]["command"]
    assert all("healthcheck" in services[s] for s in ("postgres", "redis", "nats", "minio", "mail"))


def test_commands_exist_and_settings_are_known():
    known = env_names()
    checked = 0
    for name, service in _services().items():
        for variable in service.get("environment") or {}:
            if variable.startswith("MAILROOM_"):
                assert variable in known, f"{name}: {variable} is not a setting"
        command = service.get("command")
        if isinstance(command, list) and command[:1] == ["uv"]:
            _check_command(name, command)
            checked += 1
    assert checked >= 10


def test_the_checker_rejects_unknown_commands():
    assert not _mailroom_command_exists(["bridge", "kafka"])
    assert not _mailroom_command_exists(["bridge"])
    assert _mailroom_command_exists(["bridge", "nats"])
