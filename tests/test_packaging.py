"""A plain (non-editable) install carries everything the demo, ``bcpbus init`` and the
gateway read at run time: the wheel is built from a copy of the tree and installed into a
folder of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from setuptools import find_packages

from peers.testing import scaled

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "bus", "peers", "schemas", "agents")


def test_every_package_is_listed_for_the_wheel():
    """pyproject.toml lists packages by hand (for the agents/ mapping): none may be missing."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = set(find_packages(str(ROOT), include=["bus*", "peers*", "schemas*"]))
    assert found - listed == set()


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this tree, unpacked as pip installs it, into a folder of its own."""
    work = tmp_path_factory.mktemp("wheel")
    tree = work / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "node_modules", "*.egg-info")
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=ignore)
        else:
            tree.mkdir(exist_ok=True)
            shutil.copy2(source, tree / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["-w", str(work / "dist"), str(tree)],
        check=True,
        capture_output=True,
        timeout=scaled(120),
    )
    [wheel] = (work / "dist").glob("*.whl")
    target = work / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    return target


def test_the_wheel_carries_the_data_files(installed):
    """The reference agents, the default policy, the schemas and the demo's files are in it."""
    for name in (
        "peers/reference_agents/main.md",
        "peers/reference_agents/researcher.md",
        "bus/default_policy.yaml",
        "schemas/json/envelope.json",
        "peers/demo/document.md",
        "peers/gateway/vocabulary.txt",
        "bus/py.typed",
    ):
        assert (installed / name).is_file(), name


def test_init_and_the_reference_agents_work_from_the_installed_package(installed, tmp_path):
    """Run from the installed copy, away from the source tree: the reference agents are found
    in the package, and `bcpbus init` writes a directory `bcpbus serve` accepts."""
    env = {**os.environ, "PYTHONPATH": str(installed)}

    def python(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=scaled(60),
        )

    found = python("-c", "import bus.core.identities as i; print(i.reference_agents())")
    assert found.stdout.strip() == str(installed / "peers" / "reference_agents"), found.stderr
    init = python("-m", "peers", "init", "site")
    assert init.returncode == 0, init.stderr
    assert sorted(p.name for p in (tmp_path / "site" / "agents").iterdir()) == [
        "echo.md",  # the bootstrap flow's spawnable agent: python -m peers.examples.echo
        "main.md",
        "researcher.md",
    ]
    echo = python("-c", "import peers.examples.echo")
    assert echo.returncode == 0, echo.stderr
    check = python(
        "-c", "from bus.ops.config import ServeConfig; print(ServeConfig.load('site/bcpbus.yaml'))"
    )
    assert check.returncode == 0, check.stderr
