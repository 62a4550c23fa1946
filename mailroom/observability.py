"""Process setup shared by every entry point: logging (and Sentry, metrics later)."""

from __future__ import annotations

import logging

from mailroom.settings import Settings

LOG_FORMAT = "%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s"


def setup_process(settings: Settings, *, process: str) -> None:
    """Configure logging for ``process``; call before the broker is built."""
    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT)
    logging.getLogger(__name__).debug("process %s configured", process)
