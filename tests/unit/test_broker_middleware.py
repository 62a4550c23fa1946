"""The broker's optional middleware as settings switch it on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json
from actors.broker.build import build_middleware
from mailroom.settings import Settings
from dramatiq.middleware import prometheus

middleware = build_middleware(Settings())
print(json.dumps({
    "names": [type(m).__name__ for m in middleware],
    "host": prometheus.HTTP_HOST,
    "port": prometheus.HTTP_PORT,
}))
"""


def _probe(tmp_path: Path, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MAILROOM_", "dramatiq_"))}
    clean.update(env, dramatiq_prom_db=str(tmp_path / "prometheus"), MAILROOM_BROKER__KIND="stub")
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_prometheus_exporter_listens_where_the_settings_say(tmp_path):
    probe = _probe(
        tmp_path,
        MAILROOM_BROKER__PROMETHEUS="true",
        MAILROOM_BROKER__PROMETHEUS_HOST="127.0.0.2",
        MAILROOM_BROKER__PROMETHEUS_PORT="19555",
    )
    assert "Prometheus" in probe["names"]
    assert (probe["host"], probe["port"]) == ("127.0.0.2", 19555)


def test_prometheus_is_off_unless_asked_for(tmp_path):
    assert "Prometheus" not in _probe(tmp_path)["names"]
