"""Checks CI runs beside the tests: ``alembic check`` against an embedded Postgres."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from mailroom.db.migrate import check, upgrade
from mailroom.devtools.stack import EmbeddedPostgres


def alembic_check() -> None:
    """Upgrade an empty embedded database to head, then fail on any model drift."""
    with tempfile.TemporaryDirectory(prefix="mailroom-ci-") as folder:
        with EmbeddedPostgres(Path(folder) / "postgres", fast=True) as server:
            upgrade(server.url())
            check(server.url())
    print("alembic check: no drift between models and migrations")


if __name__ == "__main__":
    {"alembic-check": alembic_check}[sys.argv[1]]()
