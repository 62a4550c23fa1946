"""The console's own metrics, served beside the process metrics (``metrics.port``)."""

from __future__ import annotations

from prometheus_client import Counter

#: Actions taken in the console, by action and outcome (done, refused, conflict).
ACTIONS = Counter(
    "mailroom_console_actions",
    "Operator actions taken in the console, by action and outcome.",
    ["action", "outcome"],
)
#: Sign-ins, by method and outcome (signed_in, refused).
SIGN_INS = Counter("mailroom_console_sign_ins", "Sign-ins to the console, by outcome.", ["outcome"])
