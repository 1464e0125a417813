"""What the bus knows of a clientId beyond its credential: roles and taint from agent definitions.

An agent with a controller channel holds the ``controller`` role, one with a reader channel the
``reader`` role; its taint is its definition's (readers default to ``high``). A peer a channel
names in ``screeners`` holds the ``screener`` role, tainted ``high``: it reads what readers
write before the gateway has validated it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from schemas.agents import load_agents
from schemas.common import TaintLevel, agent_id

__all__ = [
    "SCREENER_ROLE",
    "PeerIdentity",
    "default_agents_dir",
    "load_identities",
    "reference_agents",
]

SCREENER_ROLE = "screener"
"""The policy role of the peers channels name in ``screeners``."""


@dataclass(frozen=True)
class PeerIdentity:
    """Roles and taint for one clientId, from its agent definition."""

    roles: frozenset[str] = frozenset()
    taint: TaintLevel | None = None


def load_identities(directory: str | Path) -> dict[str, PeerIdentity]:
    """Read the agent definitions in ``directory`` into identities for ``agent:<name>``.

    Raises:
        DefinitionError: a definition is inconsistent; the message names the file and field.
    """
    identities: dict[str, PeerIdentity] = {}
    agents = load_agents(directory)
    for name, agent in agents.items():
        roles = frozenset(channel.role for channel in agent.bcp_channels)
        identities[agent_id(name)] = PeerIdentity(roles=roles, taint=agent.effective_taint)
    screeners = {s for agent in agents.values() for c in agent.bcp_channels for s in c.screeners}
    for screener in sorted(screeners):
        identities[screener] = PeerIdentity(roles=frozenset({SCREENER_ROLE}), taint="high")
    return identities


def default_agents_dir() -> Path | None:
    """``./agents`` if it exists, else the packaged reference agents: installed as
    ``peers/reference_agents`` by ``pip install .``, ``agents/`` in a source checkout."""
    root = Path(__file__).resolve().parents[2]
    for candidate in (Path("agents"), *reference_agents_dirs(root)):
        if candidate.is_dir():
            return candidate
    return None


def reference_agents() -> Path | None:
    """The packaged reference agents (never ``./agents``), or None if they are not installed."""
    for candidate in reference_agents_dirs(Path(__file__).resolve().parents[2]):
        if candidate.is_dir():
            return candidate
    return None


def reference_agents_dirs(root: Path) -> tuple[Path, Path]:
    """Where the reference agents may be, under the directory that holds the ``bus`` package."""
    return root / "peers" / "reference_agents", root / "agents"
