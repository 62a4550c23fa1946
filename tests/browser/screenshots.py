"""The console's screenshots: the docs' images, written by the browser tests on request.

``MAILROOM_WRITE_SCREENSHOTS=1`` writes them into ``docs/pages/img/`` (commit them);
otherwise they go to the test's own folder, so a run never changes the work tree and
CI never fails on a pixel.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # ``tests/conftest.py`` imports this module in every run: no Playwright then
    from playwright.sync_api import Locator, Page

#: The switch that writes the screenshots into the docs.
WRITE_SCREENSHOTS_ENV = "MAILROOM_WRITE_SCREENSHOTS"

#: The switch's value, read by ``tests/conftest.py`` before it drops every ``MAILROOM_*``
#: variable.
write_screenshots_key = pytest.StashKey[bool]()

#: The colour that covers what changes from run to run (times, Message-IDs): the page's own
#: grey of a status badge, so a covered cell reads as "a value here".
MASK_COLOUR = "#e6e9ef"

#: Where the docs take the console's images from.
DOCS_IMAGES = Path(__file__).parents[2] / "docs" / "pages" / "img"


class Screenshots:
    """Takes a page's picture as ``console-NAME.png``, where the switch says."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.taken: list[Path] = []

    def take(self, page: Page, name: str, *, hide: list[Locator] | None = None) -> Path:
        """The visible part of ``page``; ``hide`` covers what changes from run to run.

        Animations are stopped and the caret hidden, so two runs on one machine draw the
        same pixels wherever the data is the same.
        """
        path = self.folder / f"console-{name}.png"
        page.screenshot(
            path=path,
            animations="disabled",
            caret="hide",
            mask=hide or [],
            mask_color=MASK_COLOUR,
        )
        self.taken.append(path)
        return path
