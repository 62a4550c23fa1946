"""``psycopg_dsn`` (no SQLAlchemy) connects where ``libpq_dsn(database_url(...))`` does."""

from __future__ import annotations

from pathlib import Path

from psycopg.conninfo import conninfo_to_dict
from pydantic import SecretStr

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


def test_every_spelling_of_several_hosts_reaches_psycopg_and_sqlalchemy_alike():
    from sqlalchemy.dialects.postgresql.psycopg import dialect
    from sqlalchemy.engine import make_url

    expected = {
        "host": "a.example,b.example",
        "port": "5432,5433",
        "user": "u",
        "dbname": "mail",
        "target_session_attrs": "read-write",
        "password": "pw",
    }
    cases = [
        DatabaseSettings(url="postgresql+psycopg://u@a.example:5432,b.example:5433/mail"),
        DatabaseSettings(
            url="postgresql+psycopg://u@/mail?host=a.example:5432&host=b.example:5433"
        ),
        DatabaseSettings(
            url="postgresql+psycopg://u@ignored:1/mail",
            hosts=["a.example:5432", "b.example:5433"],
        ),
    ]
    for settings in cases:
        settings = settings.model_copy(update={"password": SecretStr("pw")})
        assert conninfo_to_dict(psycopg_dsn(settings)) == expected, settings.url
        _, engine_args = dialect().create_connect_args(make_url(database_url(settings)))
        assert {name: str(value) for name, value in engine_args.items()} == expected


def test_target_session_attrs_can_be_chosen_and_one_host_keeps_its_url():
    one = DatabaseSettings(url="postgresql+psycopg://u@db.example/mail")
    assert database_url(one) == one.url
    assert "target_session_attrs" not in conninfo_to_dict(psycopg_dsn(one))
    primary = DatabaseSettings(hosts=["a:1", "b:2"], target_session_attrs="primary")
    assert conninfo_to_dict(psycopg_dsn(primary))["target_session_attrs"] == "primary"
