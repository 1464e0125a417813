"""The roles the bus announced for each connected peer: what a ``sealed_to: [role:<name>]`` reads.

The bus alone knows a peer's roles (its policy's ``members``, the peers file, the peer's agent
definition) and says them in every ``peer_joined`` on ``system:presence``. :class:`Presence`
keeps the latest announcement per clientId and forgets it at ``peer_left``. A peer with no
announcement has unknown roles, and a forward that only a role entry would allow is refused
(``forward_role_unknown``), never guessed: unknown means no.

Peers that joined before the gateway subscribed to presence are learned from ``listPeers``
(:meth:`Presence.listed`, when the policy lets the gateway ask), at start and after each
reconnect (a dropped link forgets everything first, :meth:`Presence.reset`); an announcement
heard meanwhile is newer than that list and wins over it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["Presence"]


class Presence:
    """The roles of connected peers, by clientId, as the bus last announced them."""

    def __init__(self) -> None:
        self._roles: dict[str, frozenset[str]] = {}
        self._heard: set[str] | None = set()
        """ClientIds announced since the start, until :meth:`listed`: the list is older."""

    def joined(self, client_id: str, roles: Iterable[str]) -> None:
        """The bus announced ``client_id`` holding ``roles`` (a takeover announces again)."""
        self._roles[client_id] = frozenset(roles)
        if self._heard is not None:
            self._heard.add(client_id)

    def left(self, client_id: str) -> None:
        """The bus announced that ``client_id`` left: its roles are unknown again."""
        self._roles.pop(client_id, None)
        if self._heard is not None:
            self._heard.add(client_id)

    def listed(self, peers: Mapping[str, Iterable[str]]) -> None:
        """Take ``listPeers``'s answer (clientId -> roles) for peers not announced since."""
        heard = self._heard or set()
        for client_id, roles in peers.items():
            if client_id not in heard:
                self._roles[client_id] = frozenset(roles)
        self._heard = None  # From now on, presence alone keeps the view current.

    def reset(self) -> None:
        """Forget every peer (the gateway's link dropped: what it missed is unknown); then
        announcements and a new :meth:`listed` rebuild the view."""
        self._roles.clear()
        self._heard = set()

    def roles_of(self, client_id: str) -> frozenset[str] | None:
        """The roles ``client_id`` holds, or None when the bus has not announced it."""
        return self._roles.get(client_id)
