"""The BCP commands through real subprocesses: demo, serve with the gateway, gateway, budget."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess

import pytest

from peers import Controller, Peer, QueryFailed, Reader
from peers.testing import scaled

from .test_cli import BCPBUS, run, serving

CAT1 = {"category": 1, "fields": [{"name": "ok", "type": "boolean"}]}


def test_demo_runs_every_step_and_exits_0(tmp_path):
    """`bcpbus demo --yes` walks every flow, prints the bits table and the audit story."""
    db = tmp_path / "demo.db"
    result = run("demo", "--yes", "--db", str(db), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for step in range(1, 7):
        assert f"[{step}]" in out
    assert "FAILED" not in out
    assert "validation_failed" in out and "escalation_requires_justification" in out
    assert "budget_exhausted" in out and "rate_limited" in out and "Bits per channel" in out
    bits = json.loads(run("audit", "--db", str(db), "--bits", "--json", cwd=tmp_path).stdout)
    assert bits[0]["channel"] == "bcp:main:researcher" and bits[0]["budget_left"] < 2000
    # What the channel paid, split: every delivery's value, outcome and grid slot.
    assert bits[0]["value"] > 0 and bits[0]["outcome"] > 0 and bits[0]["timing"] > 0


def test_demo_without_a_terminal_rejects_the_summary_and_still_passes(tmp_path):
    """With no --yes and nothing on stdin the summary is rejected, which the demo expects."""
    result = run("demo", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "approval_rejected" in result.stdout


async def test_serve_runs_the_gateway_with_the_reference_agents(tmp_path):
    """`bcpbus serve` answers a Cat-1 query end to end with no setup beyond credentials."""
    main = run("peers", "add", "agent:main", cwd=tmp_path).stdout.strip()
    researcher = run("peers", "add", "agent:researcher", cwd=tmp_path).stdout.strip()
    async with serving(tmp_path) as url:
        controller = Controller(Peer(url, "agent:main", main))
        reader = Reader(Peer(url, "agent:researcher", researcher))

        @reader.on_query
        async def answer(query: dict[str, object]) -> dict[str, object]:
            return {"ok": True}

        await controller.start()
        await reader.start()
        try:
            delivery = await controller.ask("researcher", CAT1, timeout=scaled(10))
            assert delivery.response == {"ok": True} and delivery.bandwidth_bits == 1.0
        finally:
            await reader.close()
            await controller.close()
    story = json.loads(run("audit", "--bits", "--json", cwd=tmp_path).stdout)
    # A delivered 1-bit answer costs 2 bits and its grid slot (2 bits for the first, more for a
    # later one): one bit says it was delivered, not failed. It was charged the dearer outcome
    # (a failure) and its dearest slot, and given back the difference.
    row = story[0]
    assert row["value"] == pytest.approx(1.0) and row["outcome"] == pytest.approx(1.0)
    assert row["timing"] >= 2.0
    paid = row["value"] + row["outcome"] + row["timing"]
    assert row["charged"] - row["refunded"] == pytest.approx(paid, abs=1e-3)
    assert row["delivered"] == pytest.approx(1.0) and row["deliveries"] == 1
    verified = run("audit", "verify", cwd=tmp_path)
    assert verified.returncode == 0 and verified.stdout.startswith("ok: "), verified.stdout


async def test_standalone_gateway_and_budget_reset(tmp_path):
    """`bcpbus gateway` serves a bus started with --no-gateway; `budget reset` is logged."""
    gateway = run("peers", "add", "system:gateway", cwd=tmp_path).stdout.strip()
    main = run("peers", "add", "agent:main", cwd=tmp_path).stdout.strip()
    async with serving(tmp_path, "--no-gateway") as url:
        controller = Controller(Peer(url, "agent:main", main))
        await controller.start()
        try:
            with pytest.raises(QueryFailed) as failed:
                await controller.ask("researcher", CAT1, timeout=scaled(10))
            assert failed.value.reason == "gateway_unavailable"
            process = await asyncio.create_subprocess_exec(
                *BCPBUS,
                "gateway",
                "--url",
                url,
                "--db",
                "bcpbus.db",
                cwd=tmp_path,
                stdout=asyncio.subprocess.PIPE,
                env={**os.environ, "BCPBUS_TOKEN": gateway, "PYTHONUNBUFFERED": "1"},
            )
            try:
                assert process.stdout is not None
                async with asyncio.timeout(scaled(30)):
                    line = (await process.stdout.readline()).decode()
                assert line.startswith("gateway connected to")
                with pytest.raises(QueryFailed) as failed:
                    await controller.ask("researcher", CAT1, timeout=scaled(10))
                assert failed.value.reason == "reader_unavailable"
            finally:
                process.send_signal(signal.SIGTERM)
                async with asyncio.timeout(scaled(30)):
                    assert await process.wait() == 0
        finally:
            await controller.close()
    reset = run("budget", "reset", "main", "researcher", cwd=tmp_path)
    assert reset.returncode == 0, reset.stderr
    rows = json.loads(run("audit", "--event", "bcp_budget_reset", "--json", cwd=tmp_path).stdout)
    assert rows[0]["topic"] == "bcp:main:researcher"
    assert run("budget", "reset", "main", "nobody", cwd=tmp_path).returncode == 2
    # Three processes wrote the log (bus, gateway, budget reset): one chain all the same.
    verified = run("audit", "verify", cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout


def test_gateway_without_a_token_is_a_clear_error(tmp_path):
    """`bcpbus gateway` with no token says how to give one."""
    env = {k: v for k, v in os.environ.items() if k != "BCPBUS_TOKEN"}
    result = subprocess.run(
        [*BCPBUS, "gateway", "--url", "ws://127.0.0.1:1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert result.returncode == 2 and "BCPBUS_TOKEN" in result.stderr


def test_a_broken_agent_definition_stops_serve(tmp_path):
    """An inconsistent definition stops the bus at start with the file and field named."""
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "main.md").write_text(
        "---\nname: main\nbcp_channels:\n  - peer: researcher\n    role: controller\n"
        "    max_category: 2\n    budget_bits: -5\n---\n"
    )
    result = run("serve", "--port", "0", cwd=tmp_path)
    assert result.returncode == 2
    assert "main.md" in result.stderr and "budget_bits" in result.stderr
