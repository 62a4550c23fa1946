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


def _check_command(name: str, command: list[str]) -> None:
    assert command[:3] == ["uv", "run", "--no-dev"], f"{name}: run through uv"
    program, words = command[3], command[4:]
    if program == "mailroom":
        assert _mailroom_command_exists(words), f"{name}: `mailroom {' '.join(words)}` unknown"
    elif program == "dramatiq":
        assert words[0] == "actors", f"{name}: workers load the actors package"
        queues = words[words.index("--queues") + 1 :]
        queues = queues[: next((i for i, w in enumerate(queues) if w.startswith("-")), len(queues))]
        assert queues and set(queues) <= set(QUEUES), f"{name}: unknown queue in {queues}"
        for flag in ("--processes", "--threads"):
            assert flag in words, f"{name}: set {flag} per queue"
    else:
        raise AssertionError(f"{name}: unexpected program {program}")


def test_every_part_of_the_system_has_a_service():
    services = _services()
    assert set(services) >= REQUIRED
    workers = [s for s in services if s.startswith("worker-")]
    consumed = set()
    for worker in workers:
        command = services[worker]["command"]
        consumed |= set(command[command.index("--queues") + 1 : command.index("--processes")])
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
