"""What every page of the console works with: settings, sessions, the object store, nudges."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from starlette.requests import Request

from mailroom.adapters.storage import ObjectStore
from mailroom.settings import Settings


class Nudges(Protocol):
    """Wake the workers after an action; each returns a warning for the page, or None.

    The command that starts the console sends by actor name (the core never imports the
    actors); a nudge that cannot be sent is only late: the scheduler's sweeps catch up.
    """

    def publish_requests(self) -> str | None: ...

    def notify_final_mails(self) -> str | None: ...


class NoNudges:
    """For a console without a broker (tests): the sweeps do the work later."""

    def publish_requests(self) -> str | None:
        return None

    def notify_final_mails(self) -> str | None:
        return None


@dataclass
class ConsoleState:
    settings: Settings
    sessions: async_sessionmaker[AsyncSession]
    store: ObjectStore
    nudges: Nudges


def console_state(request: Request) -> ConsoleState:
    state: ConsoleState = request.app.state.console
    return state
