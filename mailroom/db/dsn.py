"""Connection settings for psycopg alone, without SQLAlchemy.

A process that connects only with psycopg (the scheduler: its leader lock, the work-state
gauges) need not import SQLAlchemy for ``mailroom.db.engine``'s URL handling: about 0.35 s of CPU
at each start. ``mailroom.db.engine`` re-exports the keepalive helpers for its engines.

``connection_params`` is the one reading of where and how to connect: the URL in any of its
spellings (one host, libpq's ``h1:p1,h2:p2``, SQLAlchemy's repeated ``?host=h:p``),
``database.hosts``, ``target_session_attrs``, the password and the TLS files. The psycopg DSN
(here) and the SQLAlchemy URL of the engines and alembic (``engine.database_url``) are both
rendered from it, so every connection site tries the same servers the same way.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

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
    """The libpq DSN of ``connection_params``; it carries the password: never log it."""
    from psycopg.conninfo import make_conninfo

    return make_conninfo("", **connection_params(settings))


def connection_params(settings: DatabaseSettings) -> dict[str, str]:
    """libpq's parameters of every connection (see the module's docstring).

    With more than one host, ``target_session_attrs`` defaults to ``read-write``: libpq
    tries the hosts in order and keeps the first that takes writes, so after a failover
    every new connection finds the promoted standby.
    """
    params = _url_params(settings.url)
    if settings.hosts:
        params.update(_joined(host_port(address) for address in settings.hosts))
    several = "," in params.get("host", "")
    attrs = settings.target_session_attrs or params.get("target_session_attrs", "")
    if attrs or several:
        params["target_session_attrs"] = attrs or "read-write"
    params.update(tls_params(settings))
    password = settings.password.get_secret_value()
    if password:
        params["password"] = password
    return params


def host_pairs(params: dict[str, str]) -> list[tuple[str, str]]:
    """The (host, port) pairs of libpq's comma lists; a port may be empty (libpq's default)."""
    hosts = params.get("host", "").split(",") if params.get("host") else []
    ports = params.get("port", "").split(",") if params.get("port") else []
    if len(ports) == 1 and len(hosts) > 1:
        ports *= len(hosts)  # libpq: one port for every host
    ports += [""] * (len(hosts) - len(ports))
    return list(zip(hosts, ports, strict=False))


def host_port(address: str) -> tuple[str, str]:
    """``host:port`` (or ``[v6]:port``, or a host alone) as (host, port)."""
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        return host, rest.removeprefix(":")
    host, _, port = address.partition(":")
    return host, port


def _joined(pairs: Any) -> dict[str, str]:
    pairs = list(pairs)
    joined = {"host": ",".join(host for host, _ in pairs)}
    if any(port for _, port in pairs):
        joined["port"] = ",".join(port for _, port in pairs)
    return joined


def _url_params(url: str) -> dict[str, str]:
    """libpq's parameters of ``url``, whichever way it spells several hosts."""
    from psycopg.conninfo import conninfo_to_dict

    _, separator, rest = url.partition("://")
    parts = urlsplit(f"postgresql{separator}{rest}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    query_hosts = [value for name, value in query if name == "host"]
    others = [(name, value) for name, value in query if name != "host"]
    plain = urlunsplit(parts._replace(query=urlencode(others)))
    params = {name: str(value) for name, value in conninfo_to_dict(plain).items()}
    if query_hosts:  # SQLAlchemy's spelling: ?host=h1:p1&host=h2:p2 (a libpq URL's one host)
        params.update(_joined(host_port(value) for value in query_hosts))
    return params
