"""Each process sets Sentry up once, under its own name, whatever it imports afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import sentry_sdk
from sentry_sdk.transport import Transport

events, inits = [], []


class Keep(Transport):
    def capture_envelope(self, envelope):
        for item in envelope.items:
            if item.headers.get("type") == "event":
                events.append(json.loads(item.payload.get_bytes()))


real_init = sentry_sdk.init


def counting_init(*args, **kwargs):
    inits.append(1)
    return real_init(*args, transport=Keep(), **kwargs)


sentry_sdk.init = counting_init
process = sys.argv[1]
if process != "worker":
    from mailroom.cli import load_settings

    load_settings(process)  # what `mailroom bridge stream|nats` and `mailroom scheduler` do
import actors.delivery  # what the bridges and the scheduler import next; a worker only this

sentry_sdk.capture_message("probe")
sentry_sdk.flush()
print(json.dumps({"inits": len(inits), "process": [e["tags"].get("process") for e in events]}))
"""


@pytest.mark.parametrize("process", ["bridge-nats", "scheduler", "worker"])
def test_sentry_is_set_up_once_with_the_process_name(process):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAILROOM_", "dramatiq_"))}
    env.update(
        MAILROOM_BROKER__KIND="stub",
        MAILROOM_SENTRY__DSN="https://public@sentry.invalid/1",
    )
    done = subprocess.run(
        [sys.executable, "-c", PROBE, process],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe == {"inits": 1, "process": [process]}
