"""Tests for bus/core/identities.py: roles and taint from agent definitions."""

from __future__ import annotations

from bus.core.identities import SCREENER_ROLE, PeerIdentity, load_identities
from tests.peers.gateway.test_screens import screened_agents


def test_agents_get_their_channel_roles_and_screeners_the_screener_role(tmp_path):
    """A controller, a reader, and each screener a channel names, tainted high."""
    directory = screened_agents(tmp_path, screeners=("system:screener-a", "system:screener-b"))
    identities = load_identities(directory)
    assert identities["agent:main"] == PeerIdentity(frozenset({"controller"}), "none")
    assert identities["agent:researcher"] == PeerIdentity(frozenset({"reader"}), "high")
    for screener in ("system:screener-a", "system:screener-b"):
        assert identities[screener] == PeerIdentity(frozenset({SCREENER_ROLE}), "high")
    assert len(identities) == 4
