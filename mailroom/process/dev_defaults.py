"""A process on the dev stack's links while no ``mailroom dev`` state is found says so.

The link settings default to the loopback ports of ``mailroom dev``'s embedded
servers, so a REPL or a script that imports ``actors`` beside a running
``mailroom dev`` needs no setting. Without one it would talk to whatever else
listens on those ports, and say nothing: one warning line at import says it.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from mailroom.settings import Settings
from mailroom.settings.base import DEV_PORTS, DEV_STATE_POSTGRES_DIR

logger = logging.getLogger(__name__)

#: Set by the ``mailroom`` command: its commands answer a dead or wrong link in one line of
#: their own, so the import-time warning is for REPLs and scripts only.
quiet = False

#: Host names that mean this machine.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def dev_stack_links(settings: Settings) -> list[str]:
    """The links that name a dev stack's port on this machine, as ``name host:port``."""
    links = {
        "database": settings.database.url,
        "redis": settings.redis.url,
        "nats": settings.nats.url,
    }
    found = []
    for name, url in links.items():
        try:
            parts = urlsplit(url)
            host, port = parts.hostname, parts.port
        except ValueError:  # a host list or a server list: not the dev stack's one server
            continue
        if host in LOOPBACK_HOSTS and port in DEV_PORTS:
            found.append(f"{name} {host}:{port}")
    return found


def missing_dev_stack(settings: Settings) -> str | None:
    """One line when the settings name the dev stack's ports but no dev state is found."""
    links = dev_stack_links(settings)
    state = settings.state_dir.resolve()
    if not links or (state / DEV_STATE_POSTGRES_DIR).is_dir():
        return None
    return (
        f"the settings name the ports of `mailroom dev` ({', '.join(links)}) but no "
        f"`mailroom dev` state is in {state}: whatever listens there will answer; "
        "start `mailroom dev` here or set MAILROOM_DATABASE__URL, MAILROOM_REDIS__URL and "
        "MAILROOM_NATS__URL"
    )


def warn_without_dev_stack(settings: Settings) -> None:
    """Log ``missing_dev_stack``'s line as a warning, if there is one."""
    line = None if quiet else missing_dev_stack(settings)
    if line is not None:
        logger.warning(line)
