"""One picows connection as the :class:`bus.transports.local.Socket` a
:class:`~bus.transports.connection.Connection` reads: picows's callbacks in, ``async for`` out.

picows (the ``picows`` extra) parses WebSocket frames in compiled code and calls
:meth:`PicowsSocket.on_ws_frame` for each one; this adapter turns those callbacks into what a
websockets connection gives the bus, so the connection, the door and every rule above them run
unchanged:

- text frames are read as ``str`` (invalid UTF-8 closes with 1007), binary ones as ``bytes``
  (the connection closes those with 1003), fragmented messages are put together and bounded by
  the same ``max_size`` as a single frame (1009), and fragments out of order close with 1002;
- :meth:`send` waits while the socket's write buffer is over its high water mark, as websockets
  does, and raises :class:`~websockets.exceptions.ConnectionClosed` once the link is closing;
- :meth:`close` sends the close frame, waits up to ``close_timeout`` for the peer's and drops
  the TCP connection; :attr:`close_code` is the peer's code (1006 if it sent none);
- the end of a connection closed over a frame too large raises
  :class:`~websockets.exceptions.ConnectionClosedError` with the 1009 sent, as websockets does,
  so the door counts it.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable
from typing import Any

from picows import WSCloseCode, WSFrame, WSListener, WSMsgType, WSTransport
from websockets.exceptions import ConnectionClosedError, ConnectionClosedOK
from websockets.frames import Close

__all__ = ["PicowsSocket"]

CLOSE_PROTOCOL_ERROR = 1002
CLOSE_TOO_BIG = 1009
CLOSE_INVALID_TEXT = 1007
CLOSE_ABNORMAL = 1006

MAX_QUEUE = 16
"""Messages read and not yet taken by the connection before the socket stops reading, so TCP
pushes back on the peer: websockets' ``max_queue``."""

WRITE_LIMIT = 32 * 1024
"""The write buffer's high water mark: websockets' ``write_limit``, so that slow consumers are
found (:meth:`bus.transports.connection.Connection.write_blocked`) at the same point."""


class PicowsSocket(WSListener):
    """The bus's end of one picows connection.

    Args:
        request: the HTTP upgrade request (its ``headers`` carry the ``Authorization`` token).
        remote_address: the peer's ``(host, port)``.
        max_size: the largest message in bytes, fragments included; None for no limit.
        close_timeout: seconds :meth:`close` waits for the peer's close frame.
        connected: called once the upgrade is done, with this socket: start reading it then.
    """

    kind = "websocket"

    def __init__(
        self,
        request: Any,
        remote_address: Any,
        *,
        max_size: int | None,
        close_timeout: float,
        connected: Callable[[PicowsSocket], None],
    ) -> None:
        super().__init__()
        self.request = request
        self.remote_address = remote_address
        self.transport: asyncio.Transport | None = None
        """The TCP transport, for its write buffer (slow consumers) and ``abort()``."""
        self._max_size = max_size
        self._close_timeout = close_timeout
        self._connected = connected
        self._ws: WSTransport | None = None
        self._inbox: collections.deque[str | bytes] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._writable: asyncio.Event | None = None
        self._fragments: list[bytes] = []
        self._fragmenting = False
        """A fragmented message is begun: only continuation frames may come until its end."""
        self._fragments_binary = False
        self._fragments_size = 0
        self._sent: Close | None = None
        self._rcvd: Close | None = None
        self._rcvd_first: bool | None = None
        self._gone = False
        self._gone_event = asyncio.Event()

    # picows's callbacks

    def on_ws_connected(self, transport: WSTransport) -> None:
        self._ws = transport
        tcp = transport.underlying_transport
        tcp.set_write_buffer_limits(high=WRITE_LIMIT)
        self.transport = tcp
        self._connected(self)

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        kind = frame.msg_type
        if transport.is_close_frame_sent and kind is not WSMsgType.CLOSE:
            # Closing: what the peer sent meanwhile is dropped, as websockets drops it. picows
            # also hands over the frame it closed the link for (over max_frame_size).
            return
        if kind in _DATA and self._fragmenting != (kind is WSMsgType.CONTINUATION):
            # RFC 6455 5.4: continuations only inside a message, nothing else until its end.
            # picows does not check it; websockets closes with 1002, and so does this side.
            self._fail(CLOSE_PROTOCOL_ERROR, "data frames out of order")
            return
        if kind is WSMsgType.TEXT and frame.fin:
            try:
                text = frame.get_payload_as_utf8_text()
            except UnicodeDecodeError:
                self._fail(CLOSE_INVALID_TEXT, "invalid UTF-8")
                return
            self._deliver(text)
        elif kind is WSMsgType.CLOSE:
            self._closing_received(transport, frame)
        elif kind in _DATA:
            self._fragment(kind, frame)
        # PING is answered by picows (enable_auto_pong); PONG needs nothing.

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        handshake = transport.close_handshake
        if self._sent is None and handshake is not None and handshake.sent is not None:
            # picows closed on its own: a frame over max_frame_size (1009), a protocol error.
            sent = handshake.sent
            self._sent = Close(_number(sent.code), sent.reason)
        self._gone = True
        self._gone_event.set()
        if self._writable is not None:
            self._writable.set()  # senders waiting for room go on, and raise ConnectionClosed
        self._wake()

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.Event()
        self._writable.clear()

    def resume_writing(self) -> None:
        if self._writable is not None:
            self._writable.set()

    # What the connection uses (bus.transports.local.Socket)

    @property
    def close_code(self) -> int | None:
        """None while open; the peer's close code once closed (1006 if it sent none)."""
        if not self._gone:
            return None
        return CLOSE_ABNORMAL if self._rcvd is None else self._rcvd.code

    async def send(self, message: str | bytes, *, text: bool | None = None) -> None:
        """Write one frame: text for ``str`` or UTF-8 bytes with ``text=True``, else binary.

        Raises:
            ConnectionClosed: the link is closed or closing.
        """
        ws = self._ws
        if ws is None or self._gone or self._sent is not None:
            raise self._closed_error()
        binary = isinstance(message, bytes) and not text
        ws.send(WSMsgType.BINARY if binary else WSMsgType.TEXT, message)
        writable = self._writable
        if writable is not None and not writable.is_set():
            # Written first, then waited for, as websockets does: the bytes a peer leaves
            # unread show in the write buffer, which is how the bus finds slow consumers.
            await writable.wait()
            if self._gone:
                raise self._closed_error()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Send a close frame with ``code``; wait up to ``close_timeout`` for the peer's, then
        drop the TCP connection. A second close changes nothing."""
        ws = self._ws
        if ws is None or self._gone:
            return
        if self._sent is None:
            self._sent = Close(code, reason)
            ws.send_close(WSCloseCode(code), reason.encode())
        try:
            async with asyncio.timeout(self._close_timeout):
                await self._gone_event.wait()
        except TimeoutError:
            ws.disconnect(graceful=False)
            await self._gone_event.wait()

    def __aiter__(self) -> AsyncIterator[str | bytes]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[str | bytes]:
        while True:
            while self._inbox:
                message = self._inbox.popleft()
                if len(self._inbox) == MAX_QUEUE // 4 and self.transport is not None:
                    self.transport.resume_reading()
                yield message
            if self._gone:
                if self._sent is not None and self._sent.code == CLOSE_TOO_BIG:
                    raise self._closed_error()
                return
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    # Inside

    def _deliver(self, message: str | bytes) -> None:
        self._inbox.append(message)
        if len(self._inbox) == MAX_QUEUE and self.transport is not None:
            self.transport.pause_reading()  # the connection stopped taking: TCP pushes back
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fragment(self, kind: WSMsgType, frame: WSFrame) -> None:
        if kind is not WSMsgType.CONTINUATION:
            self._fragments, self._fragments_size = [], 0
            self._fragments_binary = kind is WSMsgType.BINARY
        self._fragments_size += frame.payload_size
        if self._max_size is not None and self._fragments_size > self._max_size:
            self._fragments = []
            self._fail(CLOSE_TOO_BIG, f"over size limit ({self._fragments_size} bytes)")
            return
        self._fragments.append(frame.get_payload_as_bytes())
        self._fragmenting = not frame.fin
        if not frame.fin:
            return
        data = b"".join(self._fragments)
        self._fragments = []
        if self._fragments_binary:
            self._deliver(data)
            return
        try:
            self._deliver(data.decode())
        except UnicodeDecodeError:
            self._fail(CLOSE_INVALID_TEXT, "invalid UTF-8")

    def _closing_received(self, transport: WSTransport, frame: WSFrame) -> None:
        code = frame.get_close_code()
        self._rcvd = Close(_number(code), frame.get_close_reason())
        self._rcvd_first = self._sent is None
        if self._sent is None:  # the peer closes first: answer with its code, as websockets
            self._sent = self._rcvd
            transport.send_close(code, frame.get_close_message())
        transport.disconnect()

    def _fail(self, code: int, reason: str) -> None:
        """Close over a frame this side does not take (no ``await``: called from picows)."""
        ws = self._ws
        if ws is None or self._sent is not None:
            return
        self._sent = Close(code, reason)
        ws.send_close(WSCloseCode(code), reason.encode())
        loop = asyncio.get_running_loop()
        loop.call_later(self._close_timeout, ws.disconnect, False)

    def _closed_error(self) -> ConnectionClosedOK | ConnectionClosedError:
        """The exception websockets raises for this link's closing handshake."""
        rcvd, sent = self._rcvd, self._sent
        first = self._rcvd_first if rcvd is not None and sent is not None else None
        if sent is not None and sent.code not in (1000, 1001):
            return ConnectionClosedError(rcvd, sent, first)
        return ConnectionClosedOK(rcvd, sent, first)


_DATA = (WSMsgType.TEXT, WSMsgType.BINARY, WSMsgType.CONTINUATION)


def _number(code: Any) -> int:
    """A close code as an int: picows gives a :class:`WSCloseCode` member, or a plain int for
    codes it has no member for (4001 and the bus's other codes)."""
    return int(getattr(code, "value", code))
