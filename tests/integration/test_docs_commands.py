"""The command output the documentation shows is what the commands print."""

from __future__ import annotations

import pytest

from mailroom.devtools import docs_examples

pytestmark = pytest.mark.integration


def test_the_configuration_errors_shown_are_what_mailroom_prints():
    _, shown = docs_examples.find_block("config-errors")
    assert shown == docs_examples.config_errors(), (
        "run `uv run python -m mailroom.devtools.docs_examples --write`"
    )
