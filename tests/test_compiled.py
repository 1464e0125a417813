"""The compiled build (setup.py, ``BCPBUS_COMPILE=1``): what it compiles, that its extensions are
what Python imports once built, and that ``--version`` tells the builds apart.

CI runs this file on both builds; with ``BCPBUS_EXPECT_COMPILED=1`` (the compiled run) a build
that fell back to pure Python fails here instead of passing unnoticed.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bus.compiled import MODULES, compiled_modules, describe
from peers.testing import scaled

ROOT = Path(__file__).resolve().parents[1]
EXPECT_COMPILED = os.environ.get("BCPBUS_EXPECT_COMPILED") == "1"


def built_extension(name: str) -> Path | None:
    """The extension file a compiled build left beside ``name``'s source, if any."""
    source = ROOT / (name.replace(".", "/") + ".py")
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = source.with_name(source.stem + suffix)
        if candidate.exists():
            return candidate
    return None


def test_every_listed_module_has_its_source():
    """Each compiled module keeps its ``.py``, the fallback where no extension was built."""
    for name in MODULES:
        assert (ROOT / (name.replace(".", "/") + ".py")).is_file(), name


def setup_ext_modules(**env: str) -> list[str]:
    """What setup.py passes to ``setup(ext_modules=...)`` under ``env``, with mypyc's
    ``mypycify`` stubbed to return the paths it was given (compiling takes minutes)."""
    script = (
        "import runpy, setuptools, mypyc.build\n"
        "mypyc.build.mypycify = lambda paths, **options: paths\n"
        "setuptools.setup = lambda **kw: print('\\n'.join(kw['ext_modules']))\n"
        "runpy.run_path('setup.py', run_name='__main__')\n"
    )
    base = {k: v for k, v in os.environ.items() if k != "BCPBUS_COMPILE"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=base | env,
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=True,
    )
    return done.stdout.split()


def test_setup_compiles_the_listed_modules_only_when_asked():
    """setup.py hands mypyc the files of :data:`MODULES` with ``BCPBUS_COMPILE=1``, and
    nothing at all without it, so a plain install needs no compiler."""
    assert setup_ext_modules() == []
    assert setup_ext_modules(BCPBUS_COMPILE="0") == []
    wanted = [name.replace(".", "/") + ".py" for name in MODULES]
    assert setup_ext_modules(BCPBUS_COMPILE="1") == wanted


@pytest.mark.parametrize("name", MODULES)
def test_a_built_extension_is_what_python_imports(name):
    """Where the compiled build left an extension, importing the module loads it, not the
    ``.py``; in the compiled CI run every listed module has one."""
    extension = built_extension(name)
    if EXPECT_COMPILED:
        assert extension is not None, f"{name} was not compiled"
    module = importlib.import_module(name)
    if extension is None:
        assert module.__file__ is not None and module.__file__.endswith(".py")
        assert name not in compiled_modules()
    else:
        assert module.__file__ == str(extension)
        assert name in compiled_modules()


def test_version_names_the_build():
    """``bcpbus --version`` ends with the build it runs: compiled (with a count) or pure."""
    done = subprocess.run(
        [sys.executable, "-m", "peers", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=True,
    )
    compiled = [name for name in MODULES if built_extension(name) is not None]
    if compiled:
        expected = f"compiled ({len(compiled)} of {len(MODULES)} modules)"
    else:
        expected = "pure Python"
    assert done.stdout.strip().endswith(f"({expected})")
    assert describe() == expected
