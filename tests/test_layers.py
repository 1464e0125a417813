"""Imports run one way, schemas <- bus <- peers <- bench, and only through public modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("schemas", "bus", "peers", "bench")


def imported(path: Path) -> set[str]:
    """The absolute module names ``path`` imports, at any depth of the file."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("layer", LAYERS)
def test_no_layer_imports_a_higher_one(layer: str) -> None:
    """No module imports a layer above its own."""
    higher = LAYERS[LAYERS.index(layer) + 1 :]
    for path in sorted((ROOT / layer).rglob("*.py")):
        up = {name for name in imported(path) if name.split(".")[0] in higher}
        assert not up, f"{path.relative_to(ROOT)} imports {sorted(up)}"


@pytest.mark.parametrize("layer", LAYERS[1:])
def test_no_layer_imports_a_private_module_of_another(layer: str) -> None:
    """Other layers use public modules only: ``bus.codec``, not ``bus._json``."""
    for path in sorted((ROOT / layer).rglob("*.py")):
        private = {
            name
            for name in imported(path)
            if name.split(".")[0] in LAYERS
            and name.split(".")[0] != layer
            and any(part.startswith("_") and not part.startswith("__") for part in name.split("."))
        }
        assert not private, f"{path.relative_to(ROOT)} imports {sorted(private)}"
