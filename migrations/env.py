"""Alembic environment: the URL comes from Settings unless the caller passed one.

Online runs hold the migration advisory lock (``mailroom.db.migrate.migration_lock``),
so two ``mailroom migrate`` runs against one database apply the migrations once.
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine, pool

from mailroom.db.engine import database_url
from mailroom.db.migrate import migration_lock
from mailroom.db.models import Base
from mailroom.settings import Settings

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> str:
    return str(config.attributes.get("url") or database_url(Settings().database))


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    # NullPool: closing the connection ends the session, which releases the lock on errors.
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection, migration_lock(connection):
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
