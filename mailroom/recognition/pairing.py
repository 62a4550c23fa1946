"""The reference recognizer is for development, demos and tests, never for real mail.

It extracts with simple rules and answers with confidence it has not earned; beside
a mailbox of real mail it would settle real documents. A mailbox says it is real
(``real: true``); the reference recognizer (``mailroom recognizer``), which knows
what it is, refuses to start while one is configured, except under ``mailroom dev``,
which marks its children with ``DEV_FLAG``.
"""

from __future__ import annotations

from collections.abc import Mapping

from mailroom.settings import Settings

#: Set to ``1`` by ``mailroom dev`` in the environment of every process it starts.
DEV_FLAG = "MAILROOM_DEV"


def real_mailbox_refusal(settings: Settings, environ: Mapping[str, str]) -> str | None:
    """Why the reference recognizer must not start with these settings; None when it may."""
    real = [mailbox.name for mailbox in settings.intake.mailboxes if mailbox.real]
    if not real or environ.get(DEV_FLAG) == "1":
        return None
    names = ", ".join(repr(name) for name in real)
    return (
        f"the reference recognizer does not read real mail: mailbox {names} is marked real"
        " (intake.mailboxes[].real); run a recognition service, or use `mailroom dev`"
    )
