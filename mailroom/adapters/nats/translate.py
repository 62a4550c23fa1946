"""nats-py errors stop here: the client, the publisher and the subscriptions translate them.

Each vendor error leaves as a ``mailroom.errors`` type with the cause kept
(``raise … from exc``), as the adapters of the other external systems do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import nats.errors
import nats.js.errors

from mailroom.errors import NatsConfigError, NatsPublishFailed, NatsUnavailable


@contextlib.contextmanager
def translate_errors(what: str | Callable[[], str]) -> Iterator[None]:
    """Turn nats-py errors raised inside the block into ours; ``what`` starts the message
    (or returns it, when the block learns what it was doing as it goes)."""
    try:
        yield
    except TimeoutError as exc:  # before OSError: TimeoutError is one of its children
        raise NatsPublishFailed(f"{_text(what)}: timed out") from exc
    except (
        nats.errors.ConnectionClosedError,
        nats.errors.NoServersError,
        nats.errors.StaleConnectionError,
        nats.errors.ConnectionReconnectingError,
        nats.errors.ConnectionDrainingError,
        OSError,
    ) as exc:
        raise NatsUnavailable(f"{_text(what)}: {type(exc).__name__}: {exc}") from exc
    except nats.js.errors.BadRequestError as exc:
        raise NatsConfigError(f"{_text(what)}: {exc}") from exc
    except nats.errors.Error as exc:
        raise NatsPublishFailed(f"{_text(what)}: {type(exc).__name__}: {exc}") from exc


def _text(what: str | Callable[[], str]) -> str:
    return what if isinstance(what, str) else what()
