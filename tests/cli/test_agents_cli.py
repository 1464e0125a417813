"""`bcpbus agents check` and serve's risk verdicts, through real subprocesses."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

from peers.testing import scaled
from schemas.risk import RiskReport

from ..peers.gateway.test_risk import write_agents
from .test_cli import BCPBUS, run

REFERENCE = Path(__file__).resolve().parents[2] / "agents"


def test_the_reference_agents_pass_strict(tmp_path):
    """The reference pair passes --strict: research-findings is 10 unsealed words a push, its
    50-word finding being sealed."""
    result = run("agents", "check", str(REFERENCE), "--strict", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "research-findings: 10 unsealed words a push" in result.stdout
    assert result.stdout.rstrip().endswith("PASS")


def test_fifty_unsealed_words_fail_strict_with_a_readable_verdict(tmp_path):
    """A subscription handing its controller 50 unsealed words a push exits 1 and says why."""
    agents = write_agents(tmp_path / "agents")
    result = run("agents", "check", str(agents), "--strict", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "notes: 50 unsealed words a push" in result.stdout
    assert "FAIL, more than 32: seal note, or cut note to 8 words each" in result.stdout
    # Without --strict the report is the same, and the exit code 0.
    assert run("agents", "check", str(agents), cwd=tmp_path).returncode == 0
    # A limit that allows it passes.
    wide = run(
        "agents", "check", str(agents), "--strict", "--max-unsealed-words", "50", cwd=tmp_path
    )
    assert wide.returncode == 0, wide.stdout


def test_json_is_the_risk_report_model(tmp_path):
    """--json prints a RiskReport (schemas/json/agents_check.json)."""
    agents = write_agents(tmp_path / "agents")
    result = run("agents", "check", str(agents), "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = RiskReport.model_validate_json(result.stdout)
    assert not report.passed and report.channels[0].specs[0].unsealed_words == 50
    assert json.loads(result.stdout)["max_unsealed_words"] == 32


def test_invalid_definitions_exit_2_naming_the_file(tmp_path):
    """A definition the gateway would refuse is an error, not a report."""
    agents = write_agents(tmp_path / "agents")
    (agents / "reader.md").write_text("---\nname: reader\nbcp_channels: 3\n---\n")
    result = run("agents", "check", str(agents), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("bcpbus: error:") and "reader.md" in result.stderr


async def test_serve_says_each_channels_verdict_on_stderr(tmp_path):
    """`bcpbus serve` keeps 'listening on' first on stdout and says the verdicts on stderr."""
    agents = write_agents(tmp_path / "agents")
    process = await asyncio.create_subprocess_exec(
        *BCPBUS,
        "serve",
        "--port",
        "0",
        "--agents-dir",
        str(agents),
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        async with asyncio.timeout(scaled(30)):
            line = (await process.stdout.readline()).decode()
        assert line.startswith("listening on ws://"), line
    finally:
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(scaled(30)):
            await process.wait()
    stderr = (await process.stderr.read()).decode()
    assert "bcpbus: risk: bcp:boss:reader: FAIL, notes let more than 32" in stderr
