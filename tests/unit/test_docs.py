"""The README and the documentation site say what the code does: generated parts are current,
cited files exist, and no page tells how the project was developed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from mailroom.devtools import docs_examples
from mailroom.settings.reference import PAGE, with_reference

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs" / "pages").glob("*.md"))
#: Every page of prose: the README, the architecture, the benches' README and the site's pages.
PROSE = [README, ROOT / "ARCHITECTURE.md", ROOT / "bench" / "README.md", *PAGES]
#: Top-level folders whose files the docs cite by path.
CITED_ROOTS = ("mailroom/", "actors/", "bridges/", "scheduling/", "tests/", "bench/", "deploy/")
CITED_ROOTS += ("contracts/", "migrations/", "docs/")


def test_the_configuration_reference_is_current():
    page = PAGE.read_text()
    assert with_reference(page) == page, (
        "the configuration reference is stale: "
        "run `uv run python -m mailroom.settings.reference --write`"
    )


def test_the_sample_mails_table_is_what_intake_makes_of_them():
    _, shown = docs_examples.find_block("samples")
    assert shown == docs_examples.samples(), (
        "run `uv run python -m mailroom.devtools.docs_examples --write`"
    )


def test_the_not_seeded_warnings_are_what_the_seed_says_without_a_key():
    _, shown = docs_examples.find_block("not-seeded")
    assert shown == docs_examples.not_seeded(), (
        "run `uv run python -m mailroom.devtools.docs_examples --write`"
    )


def test_the_sentry_monitors_listed_are_the_ones_the_scheduler_checks_in_with():
    from mailroom.settings import Settings
    from scheduling.jobs import job_table
    from scheduling.runner import monitor_slug

    jobs = job_table(Settings.model_construct())
    expected = "".join(f"- `{monitor_slug(job.name)}`\n" for job in jobs)
    _, shown = docs_examples.find_block("monitors")
    assert shown == expected, f"the monitors block of the operating guide should read:\n{expected}"


def test_the_readme_is_a_front_door_that_starts_with_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    assert "uv run mailroom dev" in text[:1500]
    assert "uv run pytest" in text[:1500]


@pytest.mark.parametrize("path", PROSE, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_file_the_docs_cite_exists(path):
    cited = set(re.findall(r"`([^`\s]+)`", path.read_text()))
    missing = [
        name
        for name in sorted(cited)
        if name.startswith(CITED_ROOTS)
        and not any(mark in name for mark in "{}*<…")
        and not (ROOT / name.split(":")[0]).exists()
    ]
    assert missing == []


def test_the_docs_cite_no_file_outside_the_repository():
    folders = ["actors", "bridges", "scheduling", "mailroom", "migrations", "tests", "bench"]
    files = PROSE + [path for folder in folders for path in (ROOT / folder).rglob("*.py")]
    citing = [str(path.relative_to(ROOT)) for path in files if "DESIGN" + ".md" in path.read_text()]
    assert citing == []


def test_no_file_tells_how_the_project_was_developed():
    # The product's files describe it as it is; its history is in git. (Ordinals spelled out:
    # "[a-z]+th session" would find every `with session`.)
    ordinals = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth"
    pattern = rf"\b({ordinals}|[a-z]+teenth|[a-z]+tieth) session\b|\bissue #?[0-9]+"
    found = subprocess.run(
        ["git", "grep", "-niE", pattern, "--", ".", ":!uv.lock"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert found.returncode in (0, 1), found.stderr
    assert found.stdout == ""


def test_the_sample_stage_lines_have_the_stages_dev_prints():
    from mailroom.devtools.dev import StageView

    lines = [
        line
        for page in PAGES
        for line in page.read_text().splitlines()
        if " | notifications: " in line
    ]
    assert lines
    for line in lines:
        stages = [re.search(r"(\w+): ", part).group(1) for part in line.split(" | ")]
        assert stages == list(StageView.QUERIES)
