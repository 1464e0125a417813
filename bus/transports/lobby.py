"""The WebSocket door's sockets that have not initialized: who may open one, and which one goes
when an address is full.

Anyone can open a socket without a token, so sockets that have not initialized are counted
apart from peers (:class:`bus.core.watch.Anonymous`), in total and per address, and the caps
are decided and counted at the handshake: the door asks :meth:`Lobby.admit` before it accepts
a socket (HTTP 503 when False), then hands the :class:`~bus.transports.connection.Connection`
it reads the socket with to :meth:`Lobby.entered`, and calls :meth:`Lobby.left` once it
initialized or closed; a handshake admitted that ends without a handler calls
:meth:`Lobby.unclaimed`::

    if not lobby.admit(socket):
        ...  # answer the handshake 503
    lobby.entered(conn, socket)  # or, if the handshake failed after all: lobby.unclaimed(socket)
    ...  # the socket's headers may go now: lobby.bearer(conn) keeps its token
    lobby.left(conn, address_of(socket))

One more socket from an address at its cap closes the oldest of that address (4006) rather
than being refused, so a flood of sockets from a shared address cannot lock out a tool of that
address that initializes at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.errors import CLOSE_EVICTED
from ..core.watch import Anonymous
from .connection import Connection
from .local import Socket

if TYPE_CHECKING:
    from .websocket import SocketBus

__all__ = ["Lobby", "address_of", "bearer_of"]


class Lobby:
    """The sockets of one door that have not initialized, against the anonymous caps.

    Args:
        bus: the bus whose limits, credentials and refusal counts apply (read at each
            handshake: a reload may replace the credentials).
    """

    def __init__(self, bus: SocketBus) -> None:
        self._bus = bus
        limits = bus.limits
        self._anonymous = Anonymous(
            total=limits.max_anonymous_connections, per_address=limits.max_anonymous_per_address
        )
        self._waiting: dict[str, dict[Connection, bool]] = {}
        """By address, the sockets that have not initialized, oldest first; True for those
        that may be evicted (no peer's token at the handshake)."""
        self._reserved: dict[Socket, str] = {}
        """Sockets admitted at their handshake and counted, whose handler has not started."""
        self._bearers: dict[Connection, str] = {}
        """The handshake's token of each socket that showed one, until it initialized: kept
        here so that the socket's handshake headers can go once its handler starts."""

    def __len__(self) -> int:
        """Sockets counted as not initialized now."""
        return len(self._anonymous)

    def admit(self, socket: Socket) -> bool:
        """Whether a handshake may open ``socket``; False: answer it HTTP 503.

        Sockets that have not authenticated are counted apart from peers, in total and per
        address, so that anonymous sockets can never take the places of peers. A handshake
        that carries a peer's token (``Authorization: Bearer``) passes: anonymous sockets from
        its address (a NAT, a shared host) cannot keep it out. One more from an address at its
        cap closes the oldest of that address (4006) rather than being refused: nor can they
        keep out a newer one.
        """
        address = address_of(socket)
        refusal = self._anonymous.refusal(address)
        if refusal is not None and self._bus.credentials.identify(bearer_of(socket)) is None:
            name, _ = refusal
            if name == "max_anonymous_per_address" and self._evict_oldest(address):
                self._bus.refusals.count("evicted", address)  # the newcomer is let in
            else:
                self._bus.refusals.count(name, address)
                return False
        # Counted now, not when its handler starts: handshakes from one address that run
        # before any of their handlers (many do on picows) would all pass a full cap.
        self._anonymous.opened(address)
        self._reserved[socket] = address
        return True

    def unclaimed(self, socket: Socket) -> None:
        """``socket``'s handshake ended and no handler took it (the connection was lost, the
        upgrade failed after :meth:`admit`): give back the place :meth:`admit` counted. Safe to
        call for any socket, at any time: one that :meth:`entered` is left alone."""
        address = self._reserved.pop(socket, None)
        if address is not None:
            self._anonymous.closed(address)

    def entered(self, conn: Connection, socket: Socket) -> None:
        """``conn`` reads ``socket``: count it until :meth:`left` (a socket :meth:`admit` let in
        is counted already; an in-process link, which has no handshake, from now)."""
        address = self._reserved.pop(socket, None)
        if address is None:
            address = address_of(socket)
            self._anonymous.opened(address)
        bearer = bearer_of(socket)
        if bearer is not None:
            self._bearers[conn] = bearer
        anonymous = self._bus.credentials.identify(bearer) is None
        self._waiting.setdefault(address, {})[conn] = anonymous

    def bearer(self, conn: Connection) -> str | None:
        """The ``Authorization: Bearer`` token ``conn``'s handshake carried, for its
        ``initialize``; None once it initialized or closed (:meth:`left`), or if it showed none."""
        return self._bearers.get(conn)

    def left(self, conn: Connection, address: str) -> None:
        """Stop counting ``conn`` as anonymous: it initialized, closed, or is being evicted."""
        self._bearers.pop(conn, None)
        group = self._waiting.get(address)
        if group is None or conn not in group:
            return
        del group[conn]
        if not group:
            del self._waiting[address]
        self._anonymous.closed(address)

    def _evict_oldest(self, address: str) -> bool:
        """Close (4006) the oldest anonymous socket from ``address`` that has not initialized
        and has no request being handled (an ``initialize`` under way is let finish); False if
        none. A socket that showed a peer's token at the handshake is never one: it passed the
        cap so that anonymous sockets of its address cannot keep it out, nor may they kick it
        out before its ``initialize`` is read."""
        waiting = self._waiting.get(address, {})
        victim = next(
            (
                conn
                for conn, anonymous in waiting.items()
                if anonymous and not conn.requests_in_flight
            ),
            None,
        )
        if victim is None:
            return False
        self.left(victim, address)
        reason = "evicted: too many sockets from this address have not initialized"
        victim.spawn(victim.force_close(CLOSE_EVICTED, reason))
        return True


def bearer_of(ws: Socket) -> str | None:
    """The token of a handshake's ``Authorization: Bearer`` header, if any."""
    header = ws.request.headers.get("Authorization") if ws.request is not None else None
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    return None


def address_of(ws: Socket) -> str:
    """The remote IP address of a socket, the unit of the anonymous-connection limit."""
    remote = ws.remote_address
    return str(remote[0]) if isinstance(remote, tuple) and remote else str(remote)
