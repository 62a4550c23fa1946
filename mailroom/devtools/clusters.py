"""Clustered servers on loopback for the cluster tests and the cluster soak.

A NATS cluster of three JetStream servers, built from the same binaries as the single
servers of ``stack``. Every server listens on a fixed port (``base_port`` and up), so a
node killed and started again comes back where its peers and clients look for it.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from mailroom.devtools.stack import (
    START_TIMEOUT_S,
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
        """The JetStream meta leader's server name, once the running servers elected one."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.process is None:
                    continue
                leader = node.jsz().get("meta_cluster", {}).get("leader")
                if leader:
                    return str(leader)
            time.sleep(0.1)
        raise ServerStartError(f"NATS cluster: no JetStream meta leader in {START_TIMEOUT_S} s")
