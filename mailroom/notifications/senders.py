"""How a notification names a mail's sender: its display name, then its address.

The address (the addr-spec of From) is the sender; the display name is whatever the
mail claims and may read like another address (``ceo@bank.test``). So the name is
quoted whenever it holds anything but words, and the address always follows in
angle brackets: ``"ceo@bank.test" <attacker@evil.test>``.
"""

from __future__ import annotations

import re

#: Shown when From named no address at all.
NO_ADDRESS = "(no address)"
#: Shown when From held neither a name nor an address.
UNKNOWN_SENDER = "(unknown sender)"

#: RFC 5322 ``specials``: a name holding one is quoted, as mail clients write it.
_SPECIALS = re.compile(r'[()<>\[\]:;@\\,."]')


def shown_sender(address: str | None, name: str | None) -> str:
    """``Display Name <address>``, the name quoted when it holds specials."""
    if not name:
        return address or UNKNOWN_SENDER
    if _SPECIALS.search(name):
        name = '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{name} <{address}>" if address else f"{name} {NO_ADDRESS}"
