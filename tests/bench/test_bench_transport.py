"""The benchmarks' ``--transport picows`` starts the bus on picows (a tiny load, no timing)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from peers.testing import scaled

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("picows") is None,
    reason="picows is not installed: pip install 'bcpbus[picows]'",
)


def test_ab_compares_the_two_transports_on_one_tree():
    """`python -m bench.ab . --transport picows` runs websockets and picows alternately."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.ab", str(ROOT), "--pairs", "1", "--count", "200"]
        + ["--transport", "picows"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"this ({ROOT}, --transport picows): msgs/s" in done.stdout
    assert "this/other msgs/s per pair:" in done.stdout
