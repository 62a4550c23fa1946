"""Postgres: the engine, DSNs, the models, migrations, the database clock and the audit trail."""
