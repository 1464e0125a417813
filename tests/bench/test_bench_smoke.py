"""Each benchmark scenario starts and finishes on a tiny load (``python -m bench X --quick``).

No timing is checked: benchmarks are run by hand; this only keeps them from rotting.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from peers.testing import scaled

ROOT = Path(__file__).resolve().parents[2]


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )


@pytest.mark.parametrize(
    "scenario",
    ["fanout", "connections", "log", "soak", "http", "verify", "fetch", "cluster"],
)
def test_scenario_runs_on_a_tiny_load(scenario):
    """The scenario exits 0 and prints the machine line and its table."""
    done = run_bench(scenario, "--quick")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("machine: ")
    assert "| " in done.stdout


def test_delivery_writes_json_with_both_servers(tmp_path):
    """Scenarios 1 and 2 run interleaved and --json holds the bus/relay ratio per window."""
    out = tmp_path / "results.json"
    done = run_bench("delivery", "--quick", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    summary = results["scenarios"]["delivery"]["summary"]
    assert set(summary) == {"1", "64"}
    assert summary["64"]["ratio_msgs"]["median"] > 0
    assert results["machine"]["cores"] >= 1


def test_bcp_runs_the_five_hop_relay_beside_it(tmp_path):
    """Scenario 3's --json holds the relay5 baseline and each case's ratio to it per window."""
    out = tmp_path / "results.json"
    done = run_bench("bcp", "--quick", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "vs relay5" in done.stdout
    summary = json.loads(out.read_text())["scenarios"]["bcp"]["summary"]
    assert {"relay5/w1", "relay5/w64", "cat1/w1", "cat2/w64"} <= set(summary)
    for case in ("cat1/w1", "cat1/w64", "cat2/w1", "cat2/w64", "cat1-nogrid/w1"):
        assert summary[case]["vs_relay5"]["median"] > 0
    assert summary["relay5/w64"]["queries_per_s"]["median"] > 0


def test_ab_compares_two_trees():
    """`python -m bench.ab TREE` runs both trees alternately and prints the ratio per pair."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.ab", str(ROOT), "--pairs", "1", "--count", "200"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "this/other msgs/s per pair:" in done.stdout


def test_ab_compares_fan_out():
    """`python -m bench.ab TREE --fanout N` runs the fan-out scenario in both trees and reports
    deliveries per second and CPU per delivery."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.ab", str(ROOT), "--pairs", "1", "--count", "20"]
        + ["--fanout", "4", "--window", "4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "this/other deliveries/s per pair:" in done.stdout
    assert "this/other CPU/delivery per pair:" in done.stdout
