"""The screenshots docs/console.md shows are the ones the browser tests take."""

from __future__ import annotations

import re
from pathlib import Path

from .conftest import SCREENSHOTS

ROOT = Path(__file__).resolve().parents[3]


def test_every_screenshot_the_browser_tests_take_is_committed_and_shown():
    """Each screenshot_path("x.png") of test_browser.py is a PNG in docs/console/ that
    docs/console.md shows, and the page shows no other: retake them all with
    BCPBUS_SCREENSHOTS=1 when the pages change."""
    source = (Path(__file__).parent / "test_browser.py").read_text()
    taken = set(re.findall(r'screenshot_path\("([^"]+)"\)', source))
    page = (ROOT / "docs" / "console.md").read_text()
    shown = set(re.findall(r"\]\(console/([^)]+\.png)\)", page))
    assert taken and taken == shown
    for name in taken:
        assert (SCREENSHOTS / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), name
