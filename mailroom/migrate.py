"""Run alembic from code (CLI, dev stack, tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

#: The repository root, where alembic.ini lives.
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def alembic_config(url: str) -> Config:
    config = Config(str(PROJECT_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(PROJECT_ROOT / "migrations"))
    config.attributes["url"] = url
    config.attributes["configure_logger"] = False
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def check(url: str) -> None:
    """Raise when the models and the migrations disagree."""
    command.check(alembic_config(url))
