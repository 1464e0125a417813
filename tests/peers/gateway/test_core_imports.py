"""The gateway's core stays pure: of the bus, it imports only the bus's own pure core."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[3] / "peers" / "gateway" / "core"


def _bus_imports() -> list[str]:
    """Every ``bus`` module the core's files import, as ``file: module``."""
    found = []
    for path in sorted(CORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            found += [f"{path.name}: {n}" for n in names if n == "bus" or n.startswith("bus.")]
    return found


def test_the_gateway_core_imports_no_module_of_the_activity_log() -> None:
    """No module of peers/gateway/core imports bus.log (SQLite, a database thread): digests
    come from bus.core.digest and event names from bus.core.logevents."""
    modules = [name.split(": ")[1] for name in _bus_imports()]
    assert [m for m in modules if m == "bus.log" or m.startswith("bus.log.")] == []
    assert any(CORE.glob("*.py"))  # the check looked at the core's files


def test_the_gateway_core_imports_only_the_bus_core() -> None:
    """Of the bus, peers/gateway/core imports bus.core alone (no configuration, transports or
    shell): ``LogContent`` comes from bus.core.digest, not bus.ops.config."""
    found = _bus_imports()
    assert found  # the check saw the core's imports of bus.core
    assert [n for n in found if not n.split(": ")[1].startswith("bus.core")] == []
