"""An in-process link: a peer in the bus's own process connects without a socket.

The BCP gateway runs beside the bus in ``bcpbus serve``. Over a loopback WebSocket each of its
frames would be framed, written, read and parsed twice in the same process; over a
:func:`local_pair` the text goes from one queue to the other. Everything else is the same: the
peer still sends ``initialize`` with its token, every request is authorized, answered and logged
by the same :class:`bus.transports.connection.Connection`, and the JSON-RPC text is the same.

A :class:`LocalSocket` has the part of a websockets connection that
:class:`bus.transports.connection.Connection` and :class:`peers.client.Peer` use (``send``,
``close``, ``async for``, ``close_code``, ``remote_address``, ``request``), described by
:class:`Socket`. Get one end from :meth:`bus.server.Bus.connect_local` and hand it to
``Peer(..., connector=...)``.

Frames have no size limit here, and :meth:`LocalSocket.send` never waits for the other end to
read: only code in the bus's process can open a local link, and the bus's own limit on
deliveries in flight (``max_inflight_deliveries``) bounds what it queues for the peer.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from typing import Any, Protocol

from websockets.exceptions import ConnectionClosedOK
from websockets.frames import Close

__all__ = ["LOCAL_ADDRESS", "LocalSocket", "Socket", "local_pair"]

LOCAL_ADDRESS = "in-process"
"""The ``remote_address`` of a local link, as the activity log's ``connect`` row shows it."""


class Socket(Protocol):
    """What the bus and the SDK need of a connection: a websockets one or a local one."""

    @property
    def remote_address(self) -> Any: ...

    @property
    def close_code(self) -> int | None: ...

    @property
    def request(self) -> Any: ...

    async def send(self, message: str | bytes, *, text: bool | None = None) -> None: ...

    async def close(self, code: int = 1000, reason: str = "") -> None: ...

    def __aiter__(self) -> AsyncIterator[str | bytes]: ...


class LocalSocket:
    """One end of an in-memory link: text sent at one end is received, in order, at the other.

    Closing either end closes both, with one code for both (as a WebSocket close handshake
    would): iteration ends at both ends once the frames already sent are read, and
    :meth:`send` raises :class:`websockets.exceptions.ConnectionClosed`.
    """

    remote_address = LOCAL_ADDRESS
    kind = "local"
    """How the bus reaches a peer on this link (:attr:`bus.transports.connection.Link.kind`)."""
    request = None
    """No HTTP handshake, so no headers: a local peer authenticates in ``initialize``."""

    def __init__(self) -> None:
        self.other: LocalSocket = self
        self.close_code: int | None = None
        self.close_reason = ""
        self._inbox: collections.deque[str | bytes] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    async def send(self, message: str | bytes, *, text: bool | None = None) -> None:
        """Queue ``message`` for the other end, as websockets' ``send`` does: ``str``, or
        UTF-8 bytes with ``text=True``, is a text frame (the other end reads ``str``); other
        bytes are a binary frame (read as ``bytes``).

        Raises:
            ConnectionClosed: the link is closed.
        """
        if self.close_code is not None:
            raise ConnectionClosedOK(None, Close(self.close_code, self.close_reason))
        if text and isinstance(message, bytes):
            message = message.decode()
        self.other._deliver(message)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close both ends with ``code``; a second close changes nothing."""
        if self.close_code is not None:
            return
        for end in (self, self.other):
            end.close_code, end.close_reason = code, reason
            end._wake()

    def __aiter__(self) -> AsyncIterator[str | bytes]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[str | bytes]:
        while True:
            while self._inbox:
                yield self._inbox.popleft()
            if self.close_code is not None:
                return
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _deliver(self, message: str | bytes) -> None:
        self._inbox.append(message)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def local_pair() -> tuple[LocalSocket, LocalSocket]:
    """Two linked ends: give one to the bus and the other to the peer."""
    bus_end, peer_end = LocalSocket(), LocalSocket()
    bus_end.other, peer_end.other = peer_end, bus_end
    return bus_end, peer_end
