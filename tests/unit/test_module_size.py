"""Modules stay small enough to read in one sitting: none of the shipped code over 450 lines."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The shipped packages and the migration environment (the migrations themselves are history).
PACKAGES = ("mailroom", "actors", "bridges", "scheduling", "migrations")
#: Longest module, in lines.
MAX_LINES = 450


def _line_count(path: Path) -> int:
    return len(path.read_bytes().splitlines())


def test_no_module_is_over_450_lines():
    modules = [
        path
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if (ROOT / "migrations" / "versions") not in path.parents
    ]
    assert len(modules) > 100  # the walk found the code
    too_long = {
        str(path.relative_to(ROOT)): lines
        for path in modules
        if (lines := _line_count(path)) > MAX_LINES
    }
    assert too_long == {}, f"split these by concern (at most {MAX_LINES} lines each): {too_long}"
