"""Which build is running: the pure-Python modules, or the per-message ones compiled by mypyc.

``BCPBUS_COMPILE=1 pip install --no-build-isolation -e .`` (setup.py) compiles the modules in
:data:`MODULES` to C extensions that sit beside their sources; Python imports an extension in
preference to the ``.py`` of the same name, and the ``.py`` stays the fallback wherever no
compiled module was built. ``bcpbus --version`` ends with :func:`describe`'s answer, so an
operator or a benchmark can tell which build it runs.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import sys
from typing import Final

__all__ = ["MODULES", "VersionAction", "compiled_modules", "describe"]

MODULES: Final = (
    # The bus's per-message decisions: the JSON-RPC session, the envelope check, the topic
    # index, the routing table and the push options. Not bus.core.policy: its file models are
    # pydantic models with methods, and pydantic refuses a compiled method as a field.
    "bus.core.protocol",
    "bus.core.params",
    "bus.core.topics",
    "bus.core.router",
    "bus.core.pushes",
    # The gateway's validators and the pure functions they call on every answer.
    "peers.gateway.validation",
    "peers.gateway.bits",
    "peers.gateway.normalize",
    "peers.gateway.screening",
)
"""The modules setup.py compiles, by name. Kept to pure modules that mypyc compiles cleanly;
setup.py reads this tuple, so a module added here is compiled by the next build."""


def compiled_modules() -> list[str]:
    """Return the names in :data:`MODULES` that Python imports as compiled extensions.

    Looks each up as the import system would (a name already imported is read from its
    loader) without importing it.
    """
    found = []
    for name in MODULES:
        spec = importlib.util.find_spec(name)
        if spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            found.append(name)
    return found


def describe() -> str:
    """Return ``"compiled (N of M modules)"`` or ``"pure Python"``, for ``--version``."""
    count = len(compiled_modules())
    if count == 0:
        return "pure Python"
    return f"compiled ({count} of {len(MODULES)} modules)"


class VersionAction(argparse.Action):
    """``--version``: print the program's version and :func:`describe`, then exit.

    An action rather than ``action="version"``'s fixed text, so that looking the modules up
    (which imports their packages) costs only the runs that ask.
    """

    def __init__(self, option_strings: list[str], version: str, dest: str = "version") -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and the build")
        self.version = version

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        # On stdout, as argparse's own version action prints.
        sys.stdout.write(f"{self.version} ({describe()})\n")
        parser.exit()
