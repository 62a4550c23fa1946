"""``psycopg_dsn`` (no SQLAlchemy) connects where ``libpq_dsn(database_url(...))`` does."""

from __future__ import annotations

from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from mailroom.db.dsn import psycopg_dsn
from mailroom.db.engine import database_url, libpq_dsn
from mailroom.settings import DatabaseSettings, TlsFiles


def test_the_psycopg_dsn_gives_libpq_the_parameters_of_the_sqlalchemy_url(tmp_path: Path):
    pem = tmp_path / "file.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    cases = [
        DatabaseSettings(),
        DatabaseSettings(url="postgresql://u@db.example:6432/mail?application_name=mr"),
        DatabaseSettings(url="postgresql+psycopg://u@db.example/mail", password="p@ss:w/rd'x"),
        DatabaseSettings(url="postgresql+psycopg://u:p%40ss@db.example/mail?sslmode=require"),
        DatabaseSettings(url="postgresql+psycopg://u@/mail?host=/run/postgresql"),
        DatabaseSettings(
            url="postgresql+psycopg://u@db.example/mail",
            password="pw",
            sslmode="verify-full",
            tls=TlsFiles(ca_file=pem, cert_file=pem, key_file=pem),
        ),
    ]
    for settings in cases:
        expected = conninfo_to_dict(libpq_dsn(database_url(settings)))
        assert conninfo_to_dict(psycopg_dsn(settings)) == expected, settings.url
    # libpq itself quotes the password: a space is fine (SQLAlchemy's URL left it bare).
    spaced = DatabaseSettings(url="postgresql+psycopg://u@db.example/mail", password="p w'x")
    assert conninfo_to_dict(psycopg_dsn(spaced))["password"] == "p w'x"
