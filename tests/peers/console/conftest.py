"""The console's test rig: a real bus with its HTTP binding, the gateway, a controller and a
reader, the console mounted; and one headless chromium per test module."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from bus.ops.config import HttpSettings
from peers.bcp import Controller, Reader
from peers.console import PATH, Console, run_console
from peers.testing import BcpHarness, running_bcp

CONTROLLER = """---
name: main
bcp_channels:
  - peer: researcher
    role: controller
    max_category: 3
    budget_bits: 5000
    anomaly_action: review
    max_escalations_per_task: 1
---
main
"""
READER = """---
name: researcher
bcp_channels:
  - peer: main
    role: reader
    max_category: 3
    budget_bits: 100000
    anomaly_action: review
---
researcher
"""
CAT3 = {"category": 3, "directive": "Summarize the document.", "max_words": 40}

SCREENSHOTS = Path(__file__).resolve().parents[3] / "docs" / "console"


def chromium() -> str:
    """Debian's chromium; skipped where it is missing, except in CI, where .ci/run installs it."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs it with apt-get")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return found


def agents(tmp_path: Path) -> Path:
    directory = tmp_path / "agents"
    directory.mkdir()
    (directory / "main.md").write_text(CONTROLLER)
    (directory / "researcher.md").write_text(READER)
    return directory


@dataclass
class Rig:
    """A bus, its gateway and console, a started controller and reader."""

    h: BcpHarness
    console: Console
    main: Controller
    reader: Reader

    @property
    def url(self) -> str:
        """The console's address."""
        assert self.h.bus.http is not None
        return f"{self.h.bus.http.url}{PATH}"

    def token(self, client_id: str, roles: tuple[str, ...] = ()) -> str:
        """A new token for ``client_id`` (the old one, if any, stops working)."""
        return self.h.bus.token(client_id, roles)

    def rows(self, **where: Any) -> list[dict[str, Any]]:
        return self.h.bus.rows(**where)


@contextlib.asynccontextmanager
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    """Start everything on free ports; close it all on exit."""
    directory = agents(tmp_path)
    async with (
        running_bcp(tmp_path, agents_dir=directory, http=HttpSettings(port=0)) as h,
        run_console(h.bus.bus, agents_dir=directory) as console,
    ):
        assert console is not None
        main, reader = h.controller("main"), h.reader("researcher")
        await main.start()
        await reader.start()
        try:
            yield Rig(h, console, main, reader)
        finally:
            await reader.close()
            await main.close()


def screenshot_path(name: str) -> Path | None:
    """Where a test writes a screenshot for docs/console.md, when BCPBUS_SCREENSHOTS=1."""
    if os.environ.get("BCPBUS_SCREENSHOTS") != "1":
        return None
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS / name


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Any]:
    """One headless chromium for the module; each test opens its own context."""
    executable = chromium()
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox"]
        )
        try:
            yield launched
        finally:
            await launched.close()
