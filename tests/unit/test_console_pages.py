"""The console's pages and sign-in rules without a server: no inline script anywhere, roles
from groups, settings the console refuses to start with."""

from __future__ import annotations

import re

import pytest
from pydantic import SecretStr

from mailroom.cli.console import startup_problem
from mailroom.console.app import CONTENT_SECURITY_POLICY
from mailroom.console.auth import groups_of, role_for
from mailroom.console.files import FileObject, disposition, preview_of, table_rows
from mailroom.console.mails import body_text
from mailroom.console.pages import TEMPLATES
from mailroom.settings import ConsoleSettings


@pytest.mark.parametrize("template", sorted(TEMPLATES.glob("*.html")), ids=lambda p: p.name)
def test_no_template_has_an_inline_script_handler_or_style(template):
    html = template.read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", html), "an inline <script>"
    assert not re.search(r"\son[a-z]+\s*=", html), "an inline event handler"
    assert not re.search(r"\sstyle\s*=|<style", html), "an inline style"
    assert "|safe" not in html.replace(" ", "") and "Markup" not in html


def test_the_content_security_policy_allows_no_inline_code():
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY
    assert "unsafe" not in CONTENT_SECURITY_POLICY


def test_roles_come_from_groups_and_an_operator_group_wins():
    settings = ConsoleSettings()
    assert role_for(["mailroom-viewers", "mailroom-operators"], settings) == "operator"
    assert role_for(groups_of("x, mailroom-viewers"), settings) == "viewer"
    assert role_for(groups_of(None), settings) is None


@pytest.mark.parametrize(
    ("console", "said"),
    [
        (ConsoleSettings(auth="dev"), "only `mailroom dev` allows"),
        (ConsoleSettings(auth="oidc"), "SESSION_SECRET"),
        (ConsoleSettings(session_secret=SecretStr("k")), "OIDC_ISSUER"),
        (ConsoleSettings(auth="proxy", session_secret=SecretStr("k")), "trusted_proxies"),
    ],
)
def test_the_console_refuses_to_start_with_settings_that_leave_it_open(console, said):
    assert said in startup_problem(console)


def test_a_proxy_list_with_a_mistyped_address_fails_at_load():
    with pytest.raises(ValueError, match=r"'10\.0\.0\.300' is not an address or network"):
        ConsoleSettings(trusted_proxies=["10.0.0.300"])


def test_only_pdf_and_images_are_served_inline_and_names_are_quoted():
    pdf = FileObject(1, 'a"; b.pdf', "pdf", "b", "k", 10)
    html = FileObject(2, "page.html", "html", "b", "k", 10)
    assert disposition(pdf) == "inline; filename*=UTF-8''a%22%3B%20b.pdf"
    assert disposition(html).startswith("attachment;")
    assert preview_of(html, 100) == "download"
    assert preview_of(FileObject(3, "a.csv", "csv", "b", "k", 1000), 100) == "download"


def test_a_csv_file_becomes_rows_with_its_own_delimiter():
    assert table_rows(b"a;b\n1;2\n3;4\n", "csv", 2) == [["a", "b"], ["1", "2"]]


def test_an_html_only_mail_shows_its_text_without_scripts():
    raw = (
        b"Subject: x\r\nContent-Type: text/html; charset=utf-8\r\n\r\n"
        b"<p>Dear desk,</p><script>steal()</script><p>the notice.</p>"
    )
    assert body_text(raw) == "Dear desk,\nthe notice."


def test_a_workbook_becomes_rows_of_its_first_sheet():
    import io

    from openpyxl import Workbook

    workbook = Workbook()
    sheet = workbook.active
    sheet.append(["investor", "amount"])
    sheet.append(["Ada", 500])
    sheet.append(["Bo", None])
    data = io.BytesIO()
    workbook.save(data)
    assert table_rows(data.getvalue(), "xlsx", 2) == [["investor", "amount"], ["Ada", "500"]]
