"""``bcpbus init DIR``: a directory to run a bus from, written from what the package ships.

::

    DIR/agents/*.md          the reference agents (a controller and a reader), to edit
    DIR/policy.yaml          the built-in policy, to edit
    DIR/bcpbus-peers.yaml    no peers yet (mode 0600); add them with `bcpbus peers add`
    DIR/bcpbus.yaml          the config that points at the three, for `bcpbus serve --config`

Nothing that exists is overwritten: a file already there stops the command before it writes
anything, with its name.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from ..core.identities import reference_agents
from .credentials import Credentials
from .startup import StartupError

__all__ = ["CONFIG_TEXT", "write_starter"]

CONFIG_TEXT = """\
# bcpbus serve --config bcpbus.yaml; paths are relative to this file. Every key is optional:
# see the README's Configuration section for the limits and the gateway's settings.
host: 127.0.0.1
port: 8765
db: bcpbus.db
peers_file: bcpbus-peers.yaml
policy: policy.yaml
agents_dir: agents
"""


def write_starter(directory: Path) -> list[str]:
    """Write the starter files into ``directory``; return one line per file written.

    Raises:
        StartupError: a file to write exists already, or the reference agents are not
            installed.
    """
    agents = reference_agents()
    if agents is None:
        raise StartupError("the reference agents are not installed: reinstall bcpbus")
    sources = {Path("agents") / md.name: md.read_text(encoding="utf-8") for md in _md(agents)}
    policy = resources.files("bus").joinpath("default_policy.yaml").read_text(encoding="utf-8")
    files = {**sources, Path("policy.yaml"): policy, Path("bcpbus.yaml"): CONFIG_TEXT}
    peers = directory / "bcpbus-peers.yaml"
    existing = [directory / name for name in files if (directory / name).exists()]
    existing += [peers] if peers.exists() else []
    if existing:
        raise StartupError(
            f"{existing[0]} exists already: `bcpbus init` never overwrites; give a new directory"
        )
    (directory / "agents").mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
        written.append(f"wrote {directory / name}")
    Credentials.empty().save(peers)
    written.append(f"wrote {peers} (no peers yet)")
    return written


def _md(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.md") if p.name != "README.md")
