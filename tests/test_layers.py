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
    """Other layers use public modules only: ``bus.core.codec``, not ``bus.core._json``."""
    for path in sorted((ROOT / layer).rglob("*.py")):
        private = {
            name
            for name in imported(path)
            if name.split(".")[0] in LAYERS
            and name.split(".")[0] != layer
            and any(part.startswith("_") and not part.startswith("__") for part in name.split("."))
        }
        assert not private, f"{path.relative_to(ROOT)} imports {sorted(private)}"


# Inside bus/, the same one-way rule between its folders: decisions (core) at the bottom, then the
# activity log, then operations, then the transports, then the shell at the top (server, assemble,
# cli). A module of a folder imports its own folder or the ones before it.
BUS_LAYERS = ("bus.core", "bus.log", "bus.ops", "bus.transports", "bus")

# Upward imports that exist today, each to go when its transport becomes a link that feeds the
# bus core's events instead of calling the shell. The test fails on any other, and on any of these
# once it is gone (so the list only shrinks).
KNOWN_UPWARD: set[tuple[str, str]] = set()


def bus_layer(module: str) -> int:
    """The index in BUS_LAYERS of the folder ``module`` (a dotted bus name) belongs to."""
    parts = module.split(".")
    if parts[1] in {"__init__", "__version__"}:  # the package itself: bus.__version__
        return 0
    folder = ".".join(parts[:2])
    return BUS_LAYERS.index(folder) if folder in BUS_LAYERS else len(BUS_LAYERS) - 1


def bus_imports(path: Path) -> set[str]:
    """The bus modules ``path`` imports, relative imports resolved."""
    package = list(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module or "").split(".")]).strip(".")
            if node.module is None:  # from . import x: x is a module of that package
                names.update(f"{module}.{alias.name}" for alias in node.names)
            else:
                names.add(module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.split(".")[0] == "bus" and name != "bus"}


def test_bus_folders_import_one_way() -> None:
    """No module in bus/ imports a folder above its own, apart from the listed ones."""
    found = set()
    for path in sorted((ROOT / "bus").rglob("*.py")):
        own = bus_layer(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for name in bus_imports(path):
            if bus_layer(name) > own:
                found.add((str(path.relative_to(ROOT)), name))
    assert found <= KNOWN_UPWARD, f"new upward imports: {sorted(found - KNOWN_UPWARD)}"
    assert found == KNOWN_UPWARD, f"gone, drop from KNOWN_UPWARD: {sorted(KNOWN_UPWARD - found)}"
