"""Connection settings for psycopg alone, without SQLAlchemy.

A process that connects only with psycopg (the scheduler: its leader lock, the work-state
gauges) need not import SQLAlchemy for ``mailroom.db.engine``'s URL handling: about 0.35 s of CPU
at each start. ``mailroom.db.engine`` re-exports the keepalive helpers for its engines.
"""

from __future__ import annotations

from typing import Any

from mailroom.settings import DatabaseSettings


def keepalive_args(settings: DatabaseSettings) -> dict[str, Any]:
    """libpq parameters that make our side notice a dead network in about 25 s.

    Keepalives cover an idle connection; ``tcp_user_timeout`` covers one waiting on
    unacknowledged data (a query sent into a black hole), which keepalives never probe.
    """
    return {
        "keepalives": 1,
        "keepalives_idle": settings.keepalive_idle_s,
        "keepalives_interval": settings.keepalive_interval_s,
        "keepalives_count": settings.keepalive_count,
        "tcp_user_timeout": settings.tcp_user_timeout_ms,
    }


def server_keepalive_options(settings: DatabaseSettings) -> str:
    """The same bounds for Postgres's side, so it ends (and unlocks) a vanished session."""
    return (
        f"-c tcp_keepalives_idle={settings.keepalive_idle_s}"
        f" -c tcp_keepalives_interval={settings.keepalive_interval_s}"
        f" -c tcp_keepalives_count={settings.keepalive_count}"
        f" -c tcp_user_timeout={settings.tcp_user_timeout_ms}"
    )


def tls_params(settings: DatabaseSettings) -> dict[str, str]:
    """libpq's ``sslmode`` and certificate parameters that ``settings`` give."""
    tls = settings.tls
    params = {
        "sslmode": settings.sslmode or None,
        "sslrootcert": tls.ca_file,
        "sslcert": tls.cert_file,
        "sslkey": tls.key_file,
    }
    return {name: str(value) for name, value in params.items() if value}


def psycopg_dsn(settings: DatabaseSettings) -> str:
    """What ``libpq_dsn(database_url(settings))`` connects to, parsed by libpq itself.

    The URL without its driver name, the password and the TLS parameters added; it carries
    the password: never log it.
    """
    from psycopg.conninfo import make_conninfo

    scheme, separator, rest = settings.url.partition("://")
    url = f"{scheme.split('+', 1)[0]}{separator}{rest}"
    params = tls_params(settings)
    password = settings.password.get_secret_value()
    if password:
        params["password"] = password
    return make_conninfo(url, **params)
