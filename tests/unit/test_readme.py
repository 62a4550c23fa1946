"""The README's configuration reference matches the settings class."""

from __future__ import annotations

import re

from mailroom.settings.reference import README, with_reference


def test_readme_configuration_reference_is_current():
    readme = README.read_text()
    assert with_reference(readme) == readme, (
        "README configuration reference is stale: "
        "run `uv run python -m mailroom.settings.reference --write`"
    )


def test_readme_starts_with_the_two_commands():
    head = README.read_text()[:1500]
    assert "uv run mailroom dev" in head
    assert "uv run pytest" in head


def test_the_docs_cite_no_file_outside_the_repository():
    root = README.parent
    assert (root / "ARCHITECTURE.md").is_file()
    folders = ["actors", "bridges", "scheduling", "mailroom", "migrations", "tests", "bench"]
    files = [README, root / "ARCHITECTURE.md"]
    files += [path for folder in folders for path in (root / folder).rglob("*.py")]
    citing = [str(path.relative_to(root)) for path in files if "DESIGN" + ".md" in path.read_text()]
    assert citing == []


def test_the_sample_stage_lines_have_the_stages_dev_prints():
    from mailroom.devtools.dev import StageView

    lines = [line for line in README.read_text().splitlines() if " | notifications: " in line]
    assert lines
    for line in lines:
        stages = [re.search(r"(\w+): ", part).group(1) for part in line.split(" | ")]
        assert stages == list(StageView.QUERIES)
