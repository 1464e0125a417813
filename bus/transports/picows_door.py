"""The WebSocket door on picows: the same door as :class:`~bus.transports.websocket.WebSocketDoor`,
with picows's compiled frame parser under it instead of websockets.

Only the listener differs: accepting sockets, the HTTP upgrade (``/healthz``, the 503 answers
to anonymous sockets past their limits, the 503 while shutting down) and the keepalive pings.
Each accepted socket is a :class:`~bus.transports.picows_socket.PicowsSocket` that the door's
own handler reads as it reads a websockets connection, so joins, requests, slow consumers, the
refusal counts and shutdown are the door's code, unchanged. Choose it with ``bcpbus serve
--transport picows`` (or ``transport: picows`` in the config file) after ``pip install
'bcpbus[picows]'``; websockets stays the default and the reference.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import ssl as _ssl
from http import HTTPStatus
from typing import Any, cast

from picows import (
    WSAutoPingStrategy,
    WSUpgradeRequest,
    WSUpgradeResponse,
    WSUpgradeResponseWithListener,
)

from .picows_socket import PicowsSocket
from .websocket import SocketBus, WebSocketDoor

__all__ = ["PicowsDoor"]

logger = logging.getLogger("bus.transports.picows")

# picows's own server function gives the upgrade callback only the request, not the peer's
# address; the protocol class it builds connections with is made here instead (not in picows's
# stub, hence Any).
WSProtocol: Any = importlib.import_module("picows.picows").WSProtocol


class _PicowsLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """picows's log, with what a peer causes moved to DEBUG: picows logs every connection at
    INFO and a peer's bad frame (too large, not WebSocket) at ERROR, which the bus records in
    its own rows (``connect``, ``ws_refused``); a peer must not fill the bus's log. Errors of
    the bus's own (an exception in a callback) keep their level."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if level == logging.INFO or str(msg).startswith("WS parser error"):
            level = logging.DEBUG
        super().log(level, msg, *args, **kwargs)


_picows_log = _PicowsLog(logger, {})

PING_INTERVAL = 20.0
"""Seconds between keepalive pings, and how long a pong may take: websockets' defaults."""

READ_BUFFER = 4 * 1024
"""Bytes of the read buffer picows gives a connection to begin with (it grows for larger
frames). With picows's default of 16 KiB an idle peer took 33.5 KiB of the bus's memory, with
4 KiB 21.6 KiB, against 20.7 KiB on websockets (``bench connections --peers 2000``)."""

CLOSE_TIMEOUT = 10.0
"""Seconds a close waits for the peer's close frame: websockets' default."""


class PicowsDoor(WebSocketDoor):
    """A :class:`WebSocketDoor` listening with picows.

    Args:
        bus: what the door hands requests, joins and leaves to.
    """

    def __init__(self, bus: SocketBus) -> None:
        super().__init__(bus)
        self._listener: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int, *, ssl: _ssl.SSLContext | None) -> None:
        """Listen on ``host:port`` (0 picks a free port); with ``ssl``, serve ``wss://``."""
        loop = asyncio.get_running_loop()
        self._scheme = "wss" if ssl is not None else "ws"
        self._listener = await loop.create_server(self._protocol, host, port, ssl=ssl)
        if self._slow is not None:
            self._sweeper = asyncio.create_task(self._sweep_slow_consumers())

    @property
    def url(self) -> str:
        host, port = self.address
        return f"{self._scheme}://{host}:{port}"

    @property
    def address(self) -> tuple[str, int]:
        if self._listener is None:
            raise RuntimeError("the bus is not started")
        host, port = self._listener.sockets[0].getsockname()[:2]
        return str(host), int(port)

    def stop_accepting(self) -> None:
        if self._listener is not None:
            self._listener.close()  # the open connections stay

    def _drop_handshakes(self) -> None:
        for protocol in list(self._opening):
            protocol.transport.disconnect(False)

    async def close(self) -> None:
        await super().close()
        if self._handlers:
            await asyncio.wait(set(self._handlers))
        if self._listener is not None:
            await self._listener.wait_closed()

    # One socket

    def _protocol(self) -> Any:
        """A picows protocol for one accepted socket, whose upgrade is decided by
        :meth:`_upgrade` once its address is known."""
        limits = self._bus.limits
        protocol: Any = None

        def upgrade(request: WSUpgradeRequest) -> Any:
            assert protocol is not None
            self._opening.discard(protocol)  # the handshake ends in this call, one way or another
            tcp = protocol.transport.underlying_transport
            return self._upgrade(request, tcp.get_extra_info("peername"))

        # As picows's ws_create_server makes it, with an upgrade that can see the address.
        protocol = _Tracked(
            None,  # host and port: a client's
            None,  # path: a client's
            False,  # the server side
            upgrade,
            _picows_log,
            True,  # disconnect when a callback raises
            limits.handshake_timeout,
            True,  # keepalive pings, as websockets sends them
            PING_INTERVAL,
            PING_INTERVAL,
            WSAutoPingStrategy.PING_PERIODICALLY,
            True,  # pongs answered
            limits.max_frame_bytes or 2**62,
            None,  # extra headers: a client's
            READ_BUFFER,
        )
        protocol.opening = self._opening
        return protocol

    def _upgrade(self, request: WSUpgradeRequest, remote: Any) -> Any:
        if request.path.split(b"?", 1)[0] == b"/healthz":
            return WSUpgradeResponseWithListener(
                WSUpgradeResponse.create_ok_response(b"ok\n"), None
            )
        bus = self._bus
        if bus.closing:
            return _refused(b"shutting down\n")
        socket = PicowsSocket(
            request,
            remote,
            max_size=bus.limits.max_frame_bytes,
            close_timeout=CLOSE_TIMEOUT,
            connected=self._connected,
        )
        # Anonymous sockets are counted apart from peers, the oldest of a full address evicted,
        # by the websockets door's own rule.
        if not self.lobby.admit(socket):
            return _refused(b"too many connections that have not initialized\n")
        # picows calls on_ws_connected in this same callback once it has sent the 101; if it
        # did not (it found the upgrade invalid after asking), no handler will run.
        asyncio.get_running_loop().call_soon(self._unless_connected, socket)
        return socket

    def _unless_connected(self, socket: PicowsSocket) -> None:
        if socket.transport is None:
            self.lobby.unclaimed(socket)

    def _connected(self, socket: PicowsSocket) -> None:
        handler = asyncio.get_running_loop().create_task(self._handle_connection(cast(Any, socket)))
        self._handlers.add(handler)
        handler.add_done_callback(self._handlers.discard)


class _Tracked(WSProtocol):  # type: ignore[misc]
    """picows's protocol, in its door's ``opening`` set from its first byte until its upgrade
    (or its end): a closing bus drops those still in their handshake, which the listener's
    close leaves open (they would wait for handshake_timeout, or the garbage collector)."""

    opening: set[Any]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.opening.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.opening.discard(self)
        super().connection_lost(exc)


def _refused(body: bytes) -> WSUpgradeResponseWithListener:
    response = WSUpgradeResponse.create_error_response(HTTPStatus.SERVICE_UNAVAILABLE, body)
    return WSUpgradeResponseWithListener(response, None)
