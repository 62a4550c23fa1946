"""The console under test: its address, its system, and what a person does in a browser."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from playwright.sync_api import Page

from mailroom.devtools.system import System

#: Longest wait for a process to answer or the pipeline to bring mails to a state, in seconds.
PIPELINE_TIMEOUT_S = 180.0


@dataclass
class Console:
    system: System
    url: str

    def wait_until_up(self) -> None:
        self.system.wait_for("the console to answer", self._answers, timeout_s=PIPELINE_TIMEOUT_S)

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def wait_for_files(self, count: int) -> dict[str, list[int]]:
        """Once ``count`` files were recognized or wait for a check: their ids by sender
        domain, oldest first."""
        sql = """SELECT split_part(m.sender, '@', 2), f.id
                   FROM stored_file AS f JOIN inbound_mail AS m ON m.id = f.mail_id
                  WHERE f.status IN ('NEEDS_CHECK', 'RECOGNIZED') ORDER BY f.updated_at, f.id"""
        self.system.wait_for(
            f"{count} files recognized or waiting for a check",
            lambda: len(self.system.query(sql)) >= count,
            timeout_s=PIPELINE_TIMEOUT_S,
        )
        found: dict[str, list[int]] = {}
        for domain, file_id in self.system.query(sql):
            found.setdefault(domain, []).append(file_id)
        return found

    def file_status(self, file_id: int) -> str:
        status: str = self.system.scalar("SELECT status FROM stored_file WHERE id = %s", file_id)
        return status


def sign_in(page: Page, console_url: str, who: str) -> None:
    """Sign in as ``who`` through the console's OpenID Connect provider, as a person does.

    The console sends a visitor to its provider; the test provider's page lists the
    people it knows, each a button that signs that person in.
    """
    page.goto(f"{console_url}/review")
    page.locator(f'button[name="sub"][value="{who}"]').click()
    page.wait_for_url(f"{console_url}/**")
    assert urlsplit(page.url).path == "/review", page.url
