"""deploy/nats-cluster.conf is a configuration nats-server accepts, for each server's name."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from mailroom.devtools.stack import find_binary

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).parents[2] / "deploy" / "nats-cluster.conf"


@pytest.mark.parametrize("name", ["nats-1", "nats-2", "nats-3"])
def test_the_cluster_configuration_is_valid_for_each_server(name):
    env = {
        **os.environ,
        "NATS_SERVER_NAME": name,
        "MAILROOM_NATS_ADMIN_PASSWORD": "p0",
        "MAILROOM_NATS_PASSWORD": "p1",
        "RECOGNIZER_NATS_PASSWORD": "p2",
    }
    checked = subprocess.run(
        [str(find_binary("nats-server")), "-t", "-c", str(CONFIG)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr
