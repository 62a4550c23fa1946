"""How notifications name a sender: the claimed name, then the address that decides."""

from __future__ import annotations

import pytest

from mailroom.notifications.senders import shown_sender


@pytest.mark.parametrize(
    ("address", "name", "shown"),
    [
        ("attacker@evil.test", "ceo@bank.test", '"ceo@bank.test" <attacker@evil.test>'),
        ("jane@x.test", "Jane Döe", "Jane Döe <jane@x.test>"),
        ("j@x.test", 'Doe, "JJ"', '"Doe, \\"JJ\\"" <j@x.test>'),
        ("jane@x.test", None, "jane@x.test"),
        (None, "Undisclosed", "Undisclosed (no address)"),
        (None, None, "(unknown sender)"),
    ],
)
def test_the_address_always_follows_the_name_in_angle_brackets(address, name, shown):
    assert shown_sender(address, name) == shown
