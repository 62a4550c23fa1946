"""Smoke test of the production install: every product module imports, every process runs.

CI builds the product without the dev group (``uv sync --no-dev --locked --no-editable`` into
``.ci/prod-venv``) and points this script at that environment's Python. The servers come from
the dev environment running this script (embedded Postgres, Redis, NATS); the product runs
only from the production environment, from a scratch folder, so nothing in the checkout and
no dev-only package can stand in for what a deployment lacks. A process command that imports
tooling (as ``mailroom worker`` once imported ``aiosmtpd`` through the dev module) dies at
start here with its ImportError in the report.

    uv run python -m mailroom.devtools.prod_smoke --python .ci/prod-venv/bin/python
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from mailroom.devtools.children import spawn
from mailroom.devtools.stack import EmbeddedNats, EmbeddedPostgres, EmbeddedRedis, free_port

#: The long-running commands, as compose runs them; each gets a metrics port of its own.
PROCESSES = {
    "worker": ["worker", "--processes", "1", "--threads", "2"],
    "bridge-nats": ["bridge", "nats"],
    "bridge-stream": ["bridge", "stream"],
    "bridge-imap": ["bridge", "imap"],
    "scheduler": ["scheduler"],
    "recognizer": ["recognizer"],
}
#: How long every process must stay up before it counts as running, in seconds.
ALIVE_S = 3.0
#: How long a process may take to answer on its metrics port, in seconds.
METRICS_TIMEOUT_S = 15.0
#: How long a process may take to exit after one SIGTERM, in seconds.
STOP_TIMEOUT_S = 20.0
#: How long a one-shot command (migrate, status) may take, in seconds.
ONE_SHOT_TIMEOUT_S = 120.0

#: Run by the production Python: import every product module, never the tooling.
_IMPORT_ALL = """
import importlib, pkgutil, sys, traceback
# __main__ runs the CLI when imported; devtools is the tooling the product never loads.
SKIP = (".__main__", "mailroom.devtools")
failed, count = [], 0
def walk(name):
    global count
    try:
        module = importlib.import_module(name)
        count += 1
    except Exception:
        failed.append(name)
        traceback.print_exc()
        return
    for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
        child = f"{name}.{info.name}"
        if not any(child.endswith(s) or child.startswith(s) for s in SKIP):
            walk(child)
for root in ("mailroom", "actors", "bridges", "scheduling"):
    walk(root)
    where = sys.modules[root].__file__ if root in sys.modules else ""
    if where and not where.startswith(sys.prefix):
        failed.append(f"{root} comes from {where}, not from the install in {sys.prefix}")
tooling = sorted(name for name in sys.modules if name.startswith("mailroom.devtools"))
if tooling:
    failed.append(f"product modules loaded the tooling: {tooling}")
print(f"imported {count} product modules")
for failure in failed:
    print(f"FAILED: {failure}")
sys.exit(1 if failed else 0)
"""


class SmokeFailure(Exception):
    """A product command failed in the production install."""


@dataclass
class _Process:
    name: str
    args: list[str]
    log: Path
    metrics_port: int
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def failure(self, what: str) -> SmokeFailure:
        tail = "\n".join(self.output().splitlines()[-40:])
        return SmokeFailure(f"{self.name} ({' '.join(self.args)}): {what}\n{tail}")


def _base_env(state: Path) -> dict[str, str]:
    """The environment without stray Mailroom, Dramatiq or Python path variables."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("MAILROOM_")
        and not key.lower().startswith("dramatiq")
        and key not in ("PYTHONPATH", "VIRTUAL_ENV", "PROMETHEUS_MULTIPROC_DIR")
    }
    # Dramatiq's exporter keeps its files in one folder per machine unless told otherwise.
    env["dramatiq_prom_db"] = str(state / "dramatiq-prometheus")
    return env


def _settings_env(state: Path, postgres: str, redis: str, nats: str) -> dict[str, str]:
    """Real setting names only: strict settings reject unknown MAILROOM_ variables."""
    return {
        "MAILROOM_DATABASE__URL": postgres,
        "MAILROOM_REDIS__URL": redis,
        "MAILROOM_NATS__URL": nats,
        "MAILROOM_NATS__ALLOW_ANONYMOUS": "true",  # the embedded server takes no login
        "MAILROOM_STATE_DIR": str(state),
        # No mailbox: nothing to poll, and no dev IMAP server on this machine is touched.
        "MAILROOM_INTAKE__MAILBOXES": "[]",
        "MAILROOM_BROKER__PROMETHEUS": "true",
    }


def _run(
    bin_dir: Path, args: list[str], env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "mailroom"), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=ONE_SHOT_TIMEOUT_S,
        check=False,
    )


def _run_one_shot(bin_dir: Path, args: list[str], env: dict[str, str], cwd: Path) -> str:
    result = _run(bin_dir, args, env, cwd)
    output = result.stdout + result.stderr
    if result.returncode != 0 or "Traceback" in output:
        raise SmokeFailure(f"mailroom {' '.join(args)}: exit {result.returncode}\n{output[-4000:]}")
    return output


def _check_short_answer(
    bin_dir: Path,
    what: str,
    args: list[str],
    env: dict[str, str],
    cwd: Path,
    *,
    code: int,
    needle: str,
    max_lines: int = 1,
) -> str:
    """A command that must fail with ``code`` in at most ``max_lines`` lines naming ``needle``."""
    result = _run(bin_dir, args, env, cwd)
    lines = (result.stdout + result.stderr).strip().splitlines()
    if result.returncode != code or not 0 < len(lines) <= max_lines or needle not in lines[0]:
        raise SmokeFailure(f"{what}: exit {result.returncode}\n" + "\n".join(lines[-40:]))
    return f"  {what}: exit {code}, {len(lines)} line(s): {lines[0]}"


def check_operator_mistakes(bin_dir: Path, env: dict[str, str], cwd: Path) -> list[str]:
    """What an operator of this install sees for the usual mistakes: short answers, no traceback."""
    dead_database = f"postgresql+psycopg://mailroom@127.0.0.1:{free_port()}/mailroom"
    return [
        _check_short_answer(bin_dir, "dev", ["dev"], env, cwd, code=2, needle="dev dependencies"),
        _check_short_answer(
            bin_dir,
            "status with a misspelt variable",
            ["status"],
            {**env, "MAILROOM_DATABSE__URL": "x"},
            cwd,
            code=2,
            needle="MAILROOM_DATABSE__URL",
        ),
        _check_short_answer(
            bin_dir,
            "status with Postgres down",
            ["status"],
            {**env, "MAILROOM_DATABASE__URL": dead_database},
            cwd,
            code=1,
            needle="cannot reach Postgres",
            max_lines=3,
        ),
    ]


def check_imports(python: Path, env: dict[str, str], cwd: Path) -> str:
    # -I: no checkout on sys.path, no PYTHONPATH, no user site-packages.
    result = subprocess.run(
        [str(python), "-I", "-c", _IMPORT_ALL],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=ONE_SHOT_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        raise SmokeFailure(
            f"importing the product failed:\n{(result.stdout + result.stderr)[-6000:]}"
        )
    return result.stdout.strip()


def _metrics_answer(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def run_processes(bin_dir: Path, env: dict[str, str], cwd: Path) -> None:
    """Start every process command, check it runs and serves metrics, then stop it with SIGTERM."""
    processes = [
        _Process(name, args, cwd / f"{name}.log", free_port()) for name, args in PROCESSES.items()
    ]
    try:
        for item in processes:
            port_setting = (
                "MAILROOM_BROKER__PROMETHEUS_PORT"
                if item.name == "worker"
                else "MAILROOM_METRICS__PORT"
            )
            with item.log.open("wb") as log:
                item.process = spawn(
                    [str(bin_dir / "mailroom"), *item.args],
                    env={**env, port_setting: str(item.metrics_port)},
                    cwd=cwd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
        time.sleep(ALIVE_S)
        for item in processes:
            assert item.process is not None
            if item.process.poll() is not None:
                raise item.failure(f"exited with {item.process.returncode} within {ALIVE_S:.0f} s")
        deadline = time.monotonic() + METRICS_TIMEOUT_S
        for item in processes:
            assert item.process is not None
            while not _metrics_answer(item.metrics_port):
                if item.process.poll() is not None:
                    raise item.failure(f"exited with {item.process.returncode}")
                if time.monotonic() > deadline:
                    raise item.failure(f"no metrics on 127.0.0.1:{item.metrics_port}")
                time.sleep(0.2)
        for item in processes:
            assert item.process is not None
            item.process.send_signal(signal.SIGTERM)
        for item in processes:
            assert item.process is not None
            try:
                code = item.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise item.failure(f"still running {STOP_TIMEOUT_S:.0f} s after SIGTERM") from None
            if code != 0:
                raise item.failure(f"exited with {code} after SIGTERM")
            if "Traceback" in item.output():
                raise item.failure("logged a traceback")
            print(f"  {item.name}: ran {ALIVE_S:.0f} s, served metrics, stopped on SIGTERM")
    finally:
        for item in processes:
            if item.process is not None and item.process.poll() is None:
                os.killpg(item.process.pid, signal.SIGKILL)
                item.process.wait()


def smoke(python: Path) -> None:
    bin_dir = python.parent
    with tempfile.TemporaryDirectory(prefix="mailroom-prod-smoke-") as folder:
        root = Path(folder)
        work, state = root / "work", root / "state"
        work.mkdir()
        state.mkdir()
        with (
            EmbeddedPostgres(root / "postgres", fast=True) as postgres,
            EmbeddedRedis(root / "redis") as redis,
            EmbeddedNats(root / "nats") as nats,
        ):
            env = {
                **_base_env(state),
                **_settings_env(state, postgres.url(), redis.url, nats.url),
            }
            print(check_imports(python, env, work))
            print(*check_operator_mistakes(bin_dir, env, work), sep="\n")
            _run_one_shot(bin_dir, ["migrate"], env, work)
            print("  migrate: exit 0")
            _run_one_shot(bin_dir, ["status"], env, work)
            print("  status: exit 0")
            run_processes(bin_dir, env, work)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--python", type=Path, required=True, help="Python of the production install."
    )
    args = parser.parse_args(argv)
    # Not resolved: a venv's python is a symlink, and its folder is what holds `mailroom`.
    python = args.python.absolute()
    if not (python.parent / "mailroom").exists():
        print(
            f"prod smoke: no `mailroom` beside {python}; build the install first", file=sys.stderr
        )
        return 2
    try:
        smoke(python)
    except SmokeFailure as exc:
        print(f"prod smoke FAILED: {exc}", file=sys.stderr)
        return 1
    print("prod smoke: the production install imports and runs every process command")
    return 0


if __name__ == "__main__":
    sys.exit(main())
