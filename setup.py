"""Build hook: compile the per-message modules with mypyc when ``BCPBUS_COMPILE=1``.

Everything else about the package is in pyproject.toml. A plain ``pip install .`` (or ``-e .``)
builds nothing and ships pure Python. With ``BCPBUS_COMPILE=1``, mypyc compiles the modules
listed in ``bus/compiled.py`` to C extensions, as black does; it needs mypy, a C compiler and
the package's dependencies (for their types) where the build runs, hence::

    pip install -e '.[dev]'
    BCPBUS_COMPILE=1 pip install --no-build-isolation -e '.[dev]'

The ``.py`` files stay in the tree and the wheel: where no extension was built (another Python,
no compiler), Python imports them. ``bcpbus --version`` says which build runs.
"""

from __future__ import annotations

import os
import runpy
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent


def _ext_modules() -> list[object]:
    if os.environ.get("BCPBUS_COMPILE", "").lower() not in {"1", "true", "yes"}:
        return []
    # Imported only when asked: a plain build must not need mypy.
    from mypyc.build import mypycify

    # Read by path, not imported: the build may run before the package is importable.
    names = runpy.run_path(str(HERE / "bus" / "compiled.py"))["MODULES"]
    paths = [name.replace(".", "/") + ".py" for name in names]
    return list(mypycify(paths, opt_level="3"))


setup(ext_modules=_ext_modules())
