"""Clustered servers on loopback for the cluster tests and the cluster soak.

A NATS cluster of three JetStream servers, a Redis primary with a replica and three
sentinels, a Postgres primary with a synchronous streaming standby, built from the same
binaries as the single servers of ``stack``. Every server listens on a fixed port (``base_port`` and up), so a
node killed and started again comes back where its peers and clients look for it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from mailroom.devtools.stack import (
    START_TIMEOUT_S,
    EmbeddedPostgres,
    ServerStartError,
    _Server,
    _wait_for_port,
    find_binary,
)

#: Name of the NATS cluster the servers form.
NATS_CLUSTER_NAME = "mailroom"


@dataclass
class ClusterNats(_Server):
    """One JetStream server of a NATS cluster, started from its own config file."""

    name: str = field(init=False, default="nats")
    node: str = "n1"
    cluster_port: int = 0
    http_port: int = 0
    routes: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / f"nats-{self.node}.log"

    def start(self) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / f"{self.node}.conf"
        routes = ", ".join(f'"nats-route://127.0.0.1:{port}"' for port in self.routes)
        store = (self.data_dir / "jetstream").resolve()
        config.write_text(
            f'server_name: "{self.node}"\n'
            f'listen: "127.0.0.1:{self.port}"\n'
            f'http: "127.0.0.1:{self.http_port}"\n'
            f'jetstream {{ store_dir: "{store}" }}\n'
            f'cluster {{ name: "{NATS_CLUSTER_NAME}", listen: "127.0.0.1:{self.cluster_port}", '
            f"routes: [{routes}] }}\n"
        )
        self._spawn([str(find_binary("nats-server")), "-c", str(config)])
        assert self.process is not None
        _wait_for_port(f"nats {self.node}", self.port, self.process, self.log_path)
        return self

    def jsz(self) -> dict[str, Any]:
        """The server's JetStream report (``/jsz``), or an empty dict when it does not answer."""
        url = f"http://127.0.0.1:{self.http_port}/jsz"
        with contextlib.suppress(OSError, ValueError):
            with urllib.request.urlopen(url, timeout=1.0) as response:
                report: dict[str, Any] = json.load(response)
                return report
        return {}


@dataclass
class NatsCluster:
    """Three (or ``size``) JetStream servers routed to each other on fixed loopback ports.

    Node ``i`` listens for clients on ``base_port + i``, for routes on ``base_port + 10 + i``
    and serves monitoring on ``base_port + 20 + i``.
    """

    data_dir: Path
    base_port: int
    size: int = 3
    nodes: list[ClusterNats] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        route_ports = [self.base_port + 10 + i for i in range(self.size)]
        self.nodes = [
            ClusterNats(
                self.data_dir / f"n{i + 1}",
                port=self.base_port + i,
                node=f"n{i + 1}",
                cluster_port=route_ports[i],
                http_port=self.base_port + 20 + i,
                routes=[port for port in route_ports if port != route_ports[i]],
            )
            for i in range(self.size)
        ]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def node(self, server_name: str) -> ClusterNats:
        return next(node for node in self.nodes if node.node == server_name)

    def start(self) -> Self:
        for node in self.nodes:
            node.start()
        self.wait_for_meta_leader()
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def wait_for_meta_leader(self) -> str:
        """The JetStream meta leader's server name, once the running servers elected one and
        the leader counts every other running server as a current peer.

        A leader alone is not enough: until it knows its peers, an R3 stream is refused with
        "no suitable peers for placement".
        """
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            running = [node for node in self.nodes if node.process is not None]
            for node in running:
                meta = node.jsz().get("meta_cluster", {})
                leader = meta.get("leader")
                if not leader or leader != node.node:
                    continue
                peers = {
                    str(peer.get("name"))
                    for peer in meta.get("replicas") or []
                    if peer.get("current") and not peer.get("offline")
                }
                if {other.node for other in running if other is not node} <= peers:
                    return str(leader)
            time.sleep(0.1)
        raise ServerStartError(f"NATS cluster: no JetStream meta leader in {START_TIMEOUT_S} s")


#: Name under which the sentinels monitor the Redis master.
REDIS_MASTER_NAME = "mailroom"
#: A master silent this long is down for a sentinel, in milliseconds.
SENTINEL_DOWN_AFTER_MS = 1_000


@dataclass
class ClusterRedis(_Server):
    """A Redis server (``role`` primary or replica) or a sentinel, on a fixed port."""

    name: str = field(init=False, default="redis")
    node: str = "primary"
    #: The primary's port, for a replica and a sentinel; 0 for the primary.
    primary_port: int = 0
    sentinel: bool = False

    @property
    def log_path(self) -> Path:
        return self.data_dir / f"redis-{self.node}.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        binary = str(find_binary("redis-server"))
        folder = (self.data_dir / self.node).resolve()
        folder.mkdir(exist_ok=True)
        if self.sentinel:
            config = folder / "sentinel.conf"
            if not config.exists():  # a sentinel rewrites its file with what it learned
                config.write_text(
                    f"port {self.port}\nbind 127.0.0.1\ndir {folder}\n"
                    f"sentinel monitor {REDIS_MASTER_NAME} 127.0.0.1 {self.primary_port} 2\n"
                    f"sentinel down-after-milliseconds {REDIS_MASTER_NAME} "
                    f"{SENTINEL_DOWN_AFTER_MS}\n"
                    f"sentinel failover-timeout {REDIS_MASTER_NAME} 5000\n"
                )
            self._spawn([binary, str(config), "--sentinel"])
        else:
            args = [binary, "--bind", "127.0.0.1", "--port", str(self.port)]
            args += ["--dir", str(folder), "--appendonly", "yes", "--save", ""]
            if self.primary_port:
                args += ["--replicaof", "127.0.0.1", str(self.primary_port)]
            self._spawn(args)
        assert self.process is not None
        _wait_for_port(f"redis {self.node}", self.port, self.process, self.log_path)
        return self


@dataclass
class RedisSentinelGroup:
    """A Redis primary, one replica and three sentinels on fixed loopback ports.

    The primary listens on ``base_port``, the replica on ``base_port + 1`` and the
    sentinels on ``base_port + 10`` to ``+ 12``.
    """

    data_dir: Path
    base_port: int
    servers: list[ClusterRedis] = field(default_factory=list, init=False)
    sentinels: list[ClusterRedis] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        primary = self.base_port
        self.servers = [
            ClusterRedis(self.data_dir, port=primary, node="primary"),
            ClusterRedis(self.data_dir, port=primary + 1, node="replica", primary_port=primary),
        ]
        self.sentinels = [
            ClusterRedis(
                self.data_dir,
                port=primary + 10 + i,
                node=f"sentinel{i + 1}",
                primary_port=primary,
                sentinel=True,
            )
            for i in range(3)
        ]

    @property
    def sentinel_addresses(self) -> list[str]:
        return [sentinel.address for sentinel in self.sentinels]

    def url(self, db: int = 0) -> str:
        """A URL for the links' database; with sentinels its host is unused."""
        return f"redis://127.0.0.1:{self.base_port}/{db}"

    def start(self) -> Self:
        for server in [*self.servers, *self.sentinels]:
            server.start()
        self.wait_for_replica()
        return self

    def stop(self) -> None:
        for server in [*self.sentinels, *self.servers]:
            server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def master(self) -> ClusterRedis:
        """The server the sentinels name as master now."""
        import redis

        for sentinel in self.sentinels:
            if sentinel.process is None:
                continue
            client = redis.Redis(port=sentinel.port, socket_timeout=1.0)
            with contextlib.suppress(redis.RedisError), client:
                address: Any = client.sentinel_get_master_addr_by_name(REDIS_MASTER_NAME)
                port = int(address[1])
                return next(server for server in self.servers if server.port == port)
        raise ServerStartError("redis: no sentinel answers")

    def wait_for_replica(self) -> None:
        """Until the master has a replica in sync and every sentinel knows both."""
        import redis

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError, ServerStartError):
                master = self.master()
                with redis.Redis(port=master.port, socket_timeout=1.0) as client:
                    replication = client.info("replication")
                synced = int(replication.get("connected_slaves", 0)) >= 1 and (
                    replication.get("slave0", {}).get("state") == "online"
                )
                if synced and all(self._sentinel_sees_replica(s) for s in self.sentinels):
                    return
            time.sleep(0.1)
        raise ServerStartError(f"redis: no replica in sync within {START_TIMEOUT_S} s")

    def wait_for_failover(self, old: ClusterRedis) -> ClusterRedis:
        """The new master once the sentinels promoted another server than ``old``."""
        import redis

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError, ServerStartError):
                master = self.master()
                if master is not old:
                    with redis.Redis(port=master.port, socket_timeout=1.0) as client:
                        if client.info("replication").get("role") == "master":
                            return master
            time.sleep(0.1)
        raise ServerStartError(f"redis: no failover within {START_TIMEOUT_S} s")

    @staticmethod
    def _sentinel_sees_replica(sentinel: ClusterRedis) -> bool:
        import redis

        with redis.Redis(port=sentinel.port, socket_timeout=1.0) as client:
            return bool(client.sentinel_slaves(REDIS_MASTER_NAME))


@dataclass
class StandbyPostgres(EmbeddedPostgres):
    """A streaming standby of the Postgres on ``primary_port``, cloned at its first start."""

    primary_port: int = 0

    def start(self) -> Self:
        if not (self.pgdata / "PG_VERSION").exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.data_dir = self.data_dir.resolve()
            run_as = self._run_as()
            # --checkpoint=fast: else the clone waits for the primary's next checkpoint.
            result = subprocess.run(
                [
                    str(self._bin("pg_basebackup")),
                    *("-h", "127.0.0.1", "-p", str(self.primary_port), "-U", "postgres"),
                    *("-D", str(self.pgdata), "-R", "-X", "stream", "--checkpoint=fast"),
                ],
                capture_output=True,
                text=True,
                check=False,
                timeout=START_TIMEOUT_S,
                **run_as,  # type: ignore[call-overload]
            )
            if result.returncode != 0:
                raise ServerStartError(f"pg_basebackup failed: {result.stderr.strip()[-2000:]}")
            self.pgdata.chmod(0o700)  # Postgres refuses a data folder others may read
        return super().start()

    def promote(self) -> None:
        """``pg_ctl promote``: the standby ends recovery and takes writes."""
        result = subprocess.run(
            [str(self._bin("pg_ctl")), "promote", "-w", "-D", str(self.pgdata)],
            capture_output=True,
            text=True,
            check=False,
            timeout=START_TIMEOUT_S,
            **self._run_as(),  # type: ignore[call-overload]
        )
        if result.returncode != 0:
            raise ServerStartError(f"pg_ctl promote failed: {result.stderr.strip()[-2000:]}")


@dataclass
class PostgresPair:
    """A Postgres primary on ``base_port`` and its synchronous streaming standby on ``+ 1``.

    Synchronous: a commit returns once the standby has its WAL, so a promoted standby holds
    every commit a client saw.
    """

    data_dir: Path
    base_port: int
    database: str = "mailroom"
    primary: EmbeddedPostgres = field(init=False)
    standby: StandbyPostgres = field(init=False)

    def __post_init__(self) -> None:
        self.primary = EmbeddedPostgres(
            self.data_dir / "primary",
            port=self.base_port,
            database=self.database,
        )
        self.standby = StandbyPostgres(
            self.data_dir / "standby",
            port=self.base_port + 1,
            database=self.database,
            primary_port=self.base_port,
        )

    @property
    def hosts(self) -> list[str]:
        return [f"127.0.0.1:{self.primary.port}", f"127.0.0.1:{self.standby.port}"]

    def start(self) -> Self:
        self.primary.start()
        self.standby.start()
        return self._synchronous()

    def fail_over(self) -> None:
        """SIGKILL the primary, promote the standby, and clone a new standby where it was.

        Until the new standby streams, the promoted primary commits without waiting for one.
        """
        old = self.primary
        old.kill()
        old.stop()
        self.standby.promote()
        self.primary = self.standby
        shutil.rmtree(old.data_dir, ignore_errors=True)
        self.standby = StandbyPostgres(
            old.data_dir, port=old.port, database=self.database, primary_port=self.primary.port
        )
        self.standby.start()
        self._synchronous()

    def _synchronous(self) -> Self:
        import psycopg

        # Synchronous only once the standby streams: before, every commit would wait for it.
        with psycopg.connect(self.primary.dsn("postgres"), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
                ).fetchone()
                if row and row[0]:
                    return self
                time.sleep(0.05)
        raise ServerStartError(f"postgres: no synchronous standby in {START_TIMEOUT_S} s")

    def stop(self) -> None:
        self.standby.stop()
        self.primary.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
