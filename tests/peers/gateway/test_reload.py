"""The gateway picks up changed agent definitions and budget resets without a restart."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from bus.ops.reload import BusFiles, Reloader
from peers.gateway.reload import BudgetResets, GatewayChannels, last_row_id
from peers.testing import running_bcp, scaled

MAIN = """---
name: main
bcp_channels:
  - peer: researcher
    role: controller
    max_category: 3
    budget_bits: {budget}
{subscriptions}---
"""
NOTES = """    subscriptions:
      - id: notes
        category: 2
        questions:
          - {id: note, question: "Anything new?", max_words: 5, expected_format: short_text}
"""
READER = """---
name: researcher
bcp_channels:
  - peer: main
    role: reader
    max_category: 3
    budget_bits: 5000
---
"""
BCPBUS = str(Path(sys.executable).with_name("bcpbus"))


@pytest.fixture
def agents_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "agents"
    directory.mkdir()
    (directory / "main.md").write_text(MAIN.format(budget=1000, subscriptions=""))
    (directory / "researcher.md").write_text(READER)
    return directory


async def test_changed_definitions_reach_the_gateway_and_the_reader_is_told(tmp_path, agents_dir):
    """A new budget and a new subscription in main.md are in force after a reload, and the
    reader gets bcp_subscriptions_active listing the subscription."""
    async with running_bcp(tmp_path, agents_dir=agents_dir) as h:
        researcher = h.reader("researcher")
        await researcher.start()
        try:
            async with asyncio.timeout(scaled(5)):
                await researcher.subscriptions_received.wait()
            assert researcher.subscriptions == []
            reloader = Reloader(h.bus.log, say=lambda line: None, interval=None)
            reloader.add(GatewayChannels(h.gateway, agents_dir))
            (agents_dir / "main.md").write_text(MAIN.format(budget=2000, subscriptions=NOTES))
            researcher.subscriptions_received.clear()
            assert reloader.reload()
            assert h.gateway.channels[("main", "researcher")].budget_bits == 2000
            async with asyncio.timeout(scaled(5)):
                await researcher.subscriptions_received.wait()
            assert [s["subscription_id"] for s in researcher.subscriptions] == ["notes"]
        finally:
            await researcher.close()


async def test_an_inconsistent_definition_keeps_the_bus_and_the_gateway_as_they_run(
    tmp_path, agents_dir
):
    """A definition whose channel lacks its counterpart fails the reload for the bus and the
    gateway alike: both keep what they run."""
    async with running_bcp(tmp_path, agents_dir=agents_dir) as h:
        said: list[str] = []
        reloader = Reloader(h.bus.log, say=said.append, interval=None)
        peers_file = tmp_path / "peers.yaml"
        reloader.add(BusFiles(h.bus.bus, peers_file=peers_file, policy=None, agents_dir=agents_dir))
        reloader.add(GatewayChannels(h.gateway, agents_dir))
        (agents_dir / "researcher.md").unlink()
        before = dict(h.gateway.channels)
        identities = dict(h.bus.bus.identities)
        assert not reloader.reload()
        assert "main.md" in said[-1] and said[-1].startswith("bcpbus: reload failed")
        assert h.gateway.channels == before and h.bus.bus.identities == identities


async def test_budget_reset_takes_effect_in_a_running_gateway(tmp_path, agents_dir):
    """`bcpbus budget reset` writes its row; the running gateway's next look starts the new
    budget session, without a restart."""
    async with running_bcp(tmp_path, agents_dir=agents_dir) as h:
        channel = ("main", "researcher")
        resets = BudgetResets(h.gateway, h.bus.db, last_row_id(h.bus.db))
        h.gateway.ledger.charge(channel, 600.0)
        await h.bus.log.commit()
        process = await asyncio.create_subprocess_exec(
            BCPBUS,
            "budget",
            "reset",
            "main",
            "researcher",
            "--db",
            str(h.bus.db),
            "--agents-dir",
            str(agents_dir),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        async with asyncio.timeout(scaled(30)):
            out, err = await process.communicate()
        assert process.returncode == 0, err.decode()
        assert "a running gateway applies it within a second" in out.decode()
        assert h.gateway.ledger.used(channel) == 600.0
        await resets()
        assert h.gateway.ledger.used(channel) == 0.0
        h.gateway.ledger.charge(channel, 5.0)
        await resets()  # each row is applied once
        assert h.gateway.ledger.used(channel) == 5.0
