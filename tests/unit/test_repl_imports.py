"""What a REPL or a script sees when it imports ``actors``: every actor by name, and one line
when the settings name the dev stack's ports while no ``mailroom dev`` state is found.

Each case runs in a fresh interpreter: ``import actors`` builds the broker and sets up logging once
per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mailroom.settings.base import DEV_STATE_POSTGRES_DIR

#: What the dev-defaults line starts with.
NO_DEV_STATE = "the settings name the ports of `mailroom dev`"

_IMPORT_EACH = """
import json
import dramatiq
import actors

imported = {}
for name in actors.__all__:
    scope = {}
    exec(f"from actors import {name}", scope)
    imported[name] = scope[name].actor_name if isinstance(scope[name], dramatiq.Actor) else None
declared = sorted(dramatiq.get_broker().get_declared_actors())
print(json.dumps({"imported": imported, "declared": declared}))
"""


def _python(code: str, *, cwd: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAILROOM_", "dramatiq_"))}
    env.update(settings)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_every_actor_is_importable_from_the_package_by_its_name(tmp_path):
    done = _python(_IMPORT_EACH, cwd=tmp_path, MAILROOM_BROKER__KIND="stub")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    # Each name is the actor of that name, and no declared actor is missing from __all__.
    assert found["imported"] == {name: name for name in found["declared"]}
    assert "poll_mailbox" in found["imported"]


def test_default_links_without_dev_state_say_so_once_at_import(tmp_path):
    done = _python("import actors\nimport actors.intake", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if NO_DEV_STATE in line]
    assert len(lines) == 1, done.stderr
    assert "database 127.0.0.1:55432" in lines[0]
    assert str(tmp_path.resolve() / ".mailroom") in lines[0]
    assert "MAILROOM_DATABASE__URL" in lines[0]


def test_default_links_beside_dev_state_import_quietly(tmp_path):
    (tmp_path / ".mailroom" / DEV_STATE_POSTGRES_DIR).mkdir(parents=True)
    done = _python("import actors", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert NO_DEV_STATE not in done.stderr


def test_links_set_elsewhere_import_quietly(tmp_path):
    done = _python(
        "import actors",
        cwd=tmp_path,
        MAILROOM_DATABASE__URL="postgresql+psycopg://app@db.example.test:5432/mailroom",
        MAILROOM_REDIS__URL="redis://redis.example.test:6379/0",
        MAILROOM_NATS__URL="nats://nats.example.test:4222",
    )
    assert done.returncode == 0, done.stderr
    assert NO_DEV_STATE not in done.stderr
