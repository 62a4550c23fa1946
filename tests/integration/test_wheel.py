"""The wheel is a complete product: it carries the migrations ``mailroom migrate`` runs."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from mailroom.db.migrate import PROJECT_ROOT

pytestmark = pytest.mark.integration


def test_the_wheel_carries_alembic_ini_and_every_migration(tmp_path):
    subprocess.run(
        ["uv", "build", "--wheel", "-o", str(tmp_path)],
        cwd=PROJECT_ROOT,
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("mailroom-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    migrations = PROJECT_ROOT / "migrations"
    files = [
        "env.py",
        "script.py.mako",
        *(f"versions/{p.name}" for p in migrations.glob("versions/*.py")),
    ]
    wanted = {"mailroom/_alembic/alembic.ini"} | {
        f"mailroom/_alembic/migrations/{f}" for f in files
    }
    assert wanted <= names, sorted(wanted - names)
    assert "mailroom/db/migrate.py" in names
    assert not any("__pycache__" in name for name in names)


def test_an_installed_layout_finds_the_packaged_migrations(tmp_path, monkeypatch):
    from mailroom.db import migrate

    home = tmp_path / "_alembic"
    (home / "migrations").mkdir(parents=True)
    (home / "alembic.ini").write_text((PROJECT_ROOT / "alembic.ini").read_text())
    (home / "migrations" / "env.py").write_text("")
    monkeypatch.setattr(migrate, "PACKAGED_DIR", home)

    config = migrate.alembic_config("postgresql+psycopg://x@127.0.0.1/x")

    assert Path(config.config_file_name or "") == home / "alembic.ini"
    assert config.get_main_option("script_location") == str(home / "migrations")
