"""The README's configuration reference matches the settings class."""

from __future__ import annotations

from mailroom.settings_reference import README, with_reference


def test_readme_configuration_reference_is_current():
    readme = README.read_text()
    assert with_reference(readme) == readme, (
        "README configuration reference is stale: "
        "run `uv run python -m mailroom.settings_reference --write`"
    )


def test_readme_starts_with_the_two_commands():
    head = README.read_text()[:1500]
    assert "uv run mailroom dev" in head
    assert "uv run pytest" in head
