"""The examples of the documentation that show what a command or the code produces.

Each example sits in a page of ``docs/pages/`` between ``<!-- example:NAME:start -->`` and
``<!-- example:NAME:end -->``. The ones rendered here are cheap (no server: the sample mails
through intake's own parser, commands that stop at their settings);
``tests/unit/test_docs_examples.py`` fails when a page differs from them, and

    uv run python -m mailroom.devtools.docs_examples --write

rewrites them. The Sentry monitors come from the scheduler's job table, which the core may not
import: that test checks them. The examples of a ``mailroom dev`` run (``dev-stages``,
``dev-status``) need the whole system: ``tests/e2e/test_dev_command.py`` checks them against a
real run, and ``tests/integration/test_status_operators.py`` checks ``recognition-status``;
run them with ``DOCS_EXAMPLES_WRITE=1`` to rewrite them (:func:`check_example`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from email import message_from_bytes
from pathlib import Path

#: The documentation's pages.
PAGES = Path(__file__).resolve().parents[2] / "docs" / "pages"
_FENCE = "```"


def block_pattern(name: str) -> re.Pattern[str]:
    """The marked example ``name`` in a page: its start marker, body and end marker."""
    return re.compile(
        rf"(<!-- example:{re.escape(name)}:start -->\n)(.*?)(<!-- example:{re.escape(name)}:end -->)",
        re.DOTALL,
    )


def find_block(name: str) -> tuple[Path, str]:
    """The page holding example ``name`` and the example's current text."""
    for page in sorted(PAGES.glob("*.md")):
        found = block_pattern(name).search(page.read_text())
        if found:
            return page, found.group(2)
    raise LookupError(f"no example {name!r} in {PAGES}")


def write_block(name: str, body: str) -> None:
    """Put ``body`` in place of example ``name``."""
    page, _ = find_block(name)
    text = page.read_text()
    page.write_text(block_pattern(name).sub(lambda m: m.group(1) + body + m.group(3), text))


def fenced(text: str, language: str = "") -> str:
    return f"{_FENCE}{language}\n{text.rstrip()}\n{_FENCE}\n"


def unfenced(block: str) -> str:
    """The text inside a fenced example."""
    lines = block.strip().splitlines()
    return "\n".join(lines[1:-1]) if lines and lines[0].startswith(_FENCE) else block.strip()


def check_example(
    name: str,
    shown: str,
    *,
    language: str = "",
    same: Callable[[str, str], bool] = lambda in_docs, shown: in_docs == shown,
) -> None:
    """Fail when the docs' example ``name`` does not show ``shown``, for a test that ran the
    command; with ``DOCS_EXAMPLES_WRITE=1`` in the environment the example is rewritten first.
    """
    if os.environ.get("DOCS_EXAMPLES_WRITE") == "1":
        write_block(name, fenced(shown, language))
    _, block = find_block(name)
    assert same(unfenced(block), shown.rstrip()), (
        f"the docs' example {name!r} is stale; it should read:\n{shown}\n"
        "(rerun the test with DOCS_EXAMPLES_WRITE=1 to rewrite it)"
    )


def samples() -> str:
    """What intake makes of each sample mail of ``mailroom dev``, by intake's own parser."""
    from mailroom.devtools.seed import sample_mails
    from mailroom.intake.parsing import Limits, parse_mail
    from mailroom.settings import IntakeSettings

    intake = IntakeSettings()
    limits = Limits(
        max_attachment_bytes=intake.max_attachment_bytes,
        max_mail_bytes=intake.max_mail_bytes,
        max_attachments=intake.max_attachments,
        max_nesting=intake.max_nesting,
        min_image_bytes=intake.min_image_bytes,
    )
    rows = ["| mail | file | what intake does |", "|---|---|---|"]
    for raw in sample_mails():
        subject = str(message_from_bytes(raw)["Subject"])
        parsed = parse_mail(raw, limits)
        if not parsed.attachments:
            rows.append(f"| {subject} | (none) | the mail alone, final at once |")
        for attachment in parsed.attachments:
            if attachment.container_reason is not None:
                done = f"`CONTAINER`: {attachment.container_reason}"
            elif attachment.skip_reason is not None:
                done = f"`SKIPPED`: {attachment.skip_reason}"
            else:
                done = f"`UPLOADED`, a {attachment.pipeline} job ({attachment.file_type})"
            rows.append(f"| {subject} | `{attachment.path or attachment.name}` | {done} |")
    return "\n".join(rows) + "\n"


#: ``mailroom status`` in environments that stop it: a wrong setting each, and in the last one
#: links to production hosts (not the dev stack's ports) with Postgres's unreachable.
CONFIG_ERRORS: list[dict[str, str]] = [
    {"MAILROOM_INTAKE__MAILBOXES": '[{"name":"x","host":"h","pasword":"p"}]'},
    {"MAILROOM_INTAKE__BATCH_SIZE": "5"},
    {
        "MAILROOM_DATABASE__URL": "postgresql+psycopg://mailroom@127.0.0.1:1/mailroom",
        "MAILROOM_REDIS__URL": "redis://redis.internal:6379/0",
        "MAILROOM_NATS__URL": "nats://nats.internal:4222",
    },
]


def config_errors() -> str:
    """``mailroom status`` run with each of ``CONFIG_ERRORS``, and what it prints."""
    lines = []
    for variables in CONFIG_ERRORS:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
        env.update(variables)
        done = subprocess.run(
            [sys.executable, "-m", "mailroom", "status"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        shown = [
            f"{name}='{value}'" if not value.isalnum() else f"{name}={value}"
            for name, value in variables.items()
        ]
        lines.append("$ " + " \\\n  ".join(shown) + " mailroom status")
        lines += (done.stdout + done.stderr).rstrip().splitlines()
        lines.append(f"$ echo $?\n{done.returncode}")
    return fenced("\n".join(lines), "console")


def not_seeded() -> str:
    """What ``migrate`` warns about the minimal production settings without a runtime-config key."""
    from mailroom.config_store import secrets
    from mailroom.config_store.seed import NOT_SEEDED, entries
    from mailroom.errors import RuntimeConfigInvalid
    from mailroom.settings import DeliverySettings, IntakeSettings, Settings

    mailbox = {"name": "billing", "host": "imap.example.com", "username": "billing@example.com"}
    account = {"host": "smtp.example.com", "username": "mailroom", "sender": "mailroom@example.com"}
    settings = Settings.model_construct(
        intake=IntakeSettings(mailboxes=[{**mailbox, "password": "secret"}]),
        delivery=DeliverySettings(
            email_accounts={"default": {**account, "password": "secret"}},
            routes=[{"channel": "email", "recipient": "ops@example.com"}],
        ),
    )
    lines = []
    for kind, name, model in entries(settings):
        try:
            secrets.dump(model, secrets.Cipher(""), where=f"{kind} {name!r}")
        except RuntimeConfigInvalid as exc:
            lines.append(NOT_SEEDED % exc)
    return fenced("\n".join(lines))


#: Every example rendered here, by name.
RENDERERS: dict[str, Callable[[], str]] = {
    "samples": samples,
    "config-errors": config_errors,
    "not-seeded": not_seeded,
}


def main() -> None:
    for name, render in RENDERERS.items():
        write_block(name, render())
        print(f"updated example {name!r}")


if __name__ == "__main__" and "--write" in sys.argv:
    main()
