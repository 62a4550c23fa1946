"""The reference recognizer is for development, demos and tests, never for real mail.

It extracts with simple rules and answers with confidence it has not earned; beside
a mailbox of real mail it would settle real documents. A mailbox says it is real
(``real: true``); the reference recognizer (``mailroom recognizer``), which knows
what it is, refuses to start while one is configured, unless
``recognizer.allow_real_mailboxes`` says otherwise (``mailroom dev`` sets it).
"""

from __future__ import annotations

from mailroom.settings import Settings

#: The variable ``mailroom dev`` sets in its own environment, which its children inherit.
ALLOW_REAL_MAILBOXES = "MAILROOM_RECOGNIZER__ALLOW_REAL_MAILBOXES"


def real_mailbox_refusal(settings: Settings) -> str | None:
    """Why the reference recognizer must not start with these settings; None when it may."""
    real = [mailbox.name for mailbox in settings.intake.mailboxes if mailbox.real]
    if not real or settings.recognizer.allow_real_mailboxes:
        return None
    names = ", ".join(repr(name) for name in real)
    return (
        f"the reference recognizer does not read real mail: mailbox {names} is marked real"
        " (intake.mailboxes[].real); run a recognition service, or use `mailroom dev`"
    )
