"""The gateway's core stays pure: it imports nothing from the bus's activity log."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[3] / "peers" / "gateway" / "core"


def test_the_gateway_core_imports_no_module_of_the_activity_log() -> None:
    """No module of peers/gateway/core imports bus.log (SQLite, a database thread): digests
    come from bus.core.digest and event names from bus.core.logevents."""
    found = []
    for path in sorted(CORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            found += [
                f"{path.name}: {n}" for n in names if n == "bus.log" or n.startswith("bus.log.")
            ]
    assert found == []
    assert any(CORE.glob("*.py"))  # the check looked at the core's files
