"""A server that refuses a process's login at its start: one line and exit 2, not an outage.

The rule for every long-running process (worker, scheduler, both bridges, the
reference recognizer): an unreachable server is an outage, waited out and told once
per back-off step (``outage.py``); refused credentials are a configuration error
that no wait can fix, so the process says which server refused which login, in
one ERROR line, and exits with ``EXIT_LOGIN_REFUSED`` for its supervisor to show.
Servers a process only reaches later check the same at that first connection
(the NATS bridge and the recognizer in their connect, the stream bridge at its
first read).
"""

from __future__ import annotations

import re

import psycopg
import redis.exceptions

from mailroom.adapters.redis_client import sync_client
from mailroom.db.dsn import psycopg_dsn
from mailroom.process.outage import describe_redis_pool
from mailroom.settings import Settings

#: Exit status of a process whose server refused its credentials (a configuration error).
EXIT_LOGIN_REFUSED = 2

#: What libpq says when the server refuses the login (user, password, role).
POSTGRES_LOGIN_REFUSED = re.compile(
    r"authentication failed|no password supplied|role .* does not exist"
)


def login_refusals(settings: Settings, *, postgres: bool = True, broker: bool = True) -> list[str]:
    """Why Postgres or the broker's Redis refuse this process's login; empty when neither does.

    A server that cannot be reached is not a refusal: the process starts and waits for it.
    """
    found = []
    if broker and settings.broker.kind == "redis":
        client = sync_client(settings.broker_redis_url, settings.broker_redis, attempts=0)
        try:
            client.ping()
        except redis.exceptions.AuthenticationError as exc:
            found.append(
                f"Redis {describe_redis_pool(client.connection_pool)} refused the login ({exc}); "
                "check MAILROOM_REDIS__USERNAME and MAILROOM_REDIS__PASSWORD"
            )
        except (redis.exceptions.RedisError, OSError):
            pass
        finally:
            client.close()
    if postgres:
        try:
            psycopg.connect(psycopg_dsn(settings.database), connect_timeout=5).close()
        except psycopg.OperationalError as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            if POSTGRES_LOGIN_REFUSED.search(first):
                found.append(
                    f"Postgres refused the login ({first.removeprefix('connection failed: ')}); "
                    "check MAILROOM_DATABASE__URL and MAILROOM_DATABASE__PASSWORD"
                )
    return found
