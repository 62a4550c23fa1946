"""`--help` texts are for users: no developer notes, no reStructuredText markup."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer.main
from typer.testing import CliRunner

from mailroom.cli import app
from mailroom.cli.delivery import SUBJECT_CHARS, default_subject


def _help_texts(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """(command path, text) for every command's help and every option's help."""
    where = " ".join(path) or "mailroom"
    yield where, command.help or ""
    for param in command.params:
        yield f"{where} {param.name}", getattr(param, "help", None) or ""
    for name, sub in getattr(command, "commands", {}).items():
        yield from _help_texts(sub, (*path, name))


def test_no_help_text_has_backticks_or_developer_notes():
    texts = list(_help_texts(typer.main.get_command(app)))
    assert len(texts) > 40
    assert [where for where, text in texts if "``" in text or "outer module" in text] == []
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"})
    assert "reads mailboxes" in result.output


def test_a_notification_without_subject_gets_its_first_line():
    assert default_subject("\n  Invoice 42 is late  \nmore") == "Invoice 42 is late"
    long = default_subject("x" * 200)
    assert len(long) == SUBJECT_CHARS and long.endswith("…")
    assert default_subject("  \n ") == "Mailroom notification"
