"""How many sockets may be reading a large frame at once, for the whole bus.

The byte budget (:class:`bus.transports.connection.ByteBudget`) counts a request from the moment
its frame is read whole; until then the frame sits in the socket's buffers, where no budget
sees it. A hundred peers that each send a 900 KiB message at the same moment would so have
the bus hold a hundred frames before refusing most of them. :class:`Intake` bounds that: a
socket that has :data:`LARGE` bytes or more of a frame still unread by its read loop takes one
of ``slots``; with none free it stops being read (TCP holds the rest, and slows the sender)
until another socket's read loop takes its frame. Frames smaller than :data:`LARGE` (pings,
answers, ordinary messages) never wait for a slot.

The :class:`Reader` also lets go of the last frame once the read loop took it: websockets'
parser keeps it until the next frame arrives, which for a peer that sent one large message and
waits for its answer is as long as the bus holds the message, a second copy of it.

A slot is held only while a frame is being read, and a frame being read always ends: the
sender finishes it or its connection closes (authenticated peers are accountable; sockets that
never initialize are closed by ``initialize_timeout``).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Sized
from typing import Any

__all__ = ["LARGE", "Intake"]

LARGE = 64 << 10
"""Bytes of unread frames from one socket past which it needs a slot."""

_HEADER = 14
"""The most bytes of WebSocket framing around a frame's text (header and mask)."""


class Intake:
    """The slots for sockets reading a large frame.

    Args:
        slots: how many sockets may be reading a large frame at once (at least 1).
    """

    def __init__(self, slots: int) -> None:
        self.slots = max(1, slots)
        self._holders: set[Reader] = set()
        self._waiting: collections.deque[Reader] = collections.deque()

    @property
    def reading(self) -> int:
        """Sockets holding a slot now."""
        return len(self._holders)

    @property
    def waiting(self) -> int:
        """Sockets stopped until a slot frees."""
        return len(self._waiting)

    def watch(self, ws: Any) -> Reader | None:
        """Count what ``ws`` (a websockets connection) reads from its socket; return its
        :class:`Reader`, whose :meth:`~Reader.taken` the read loop calls for each frame it takes
        and :meth:`~Reader.close` once it ends. None for a link with no socket (in-process)."""
        transport = getattr(ws, "transport", None)
        receive = getattr(ws, "data_received", None)
        if not isinstance(transport, asyncio.ReadTransport) or receive is None:
            return None
        reader = Reader(self, transport, receive, _unparsed(ws))
        # The transport calls its protocol's data_received: counting goes in between.
        ws.data_received = reader.data_received
        frames = getattr(ws, "recv_messages", None)
        if isinstance(getattr(frames, "frames", None), Sized) and callable(
            getattr(frames, "put", None)
        ):
            reader.assembled(frames)
        return reader

    def _acquire(self, reader: Reader) -> bool:
        if len(self._holders) < self.slots:
            self._holders.add(reader)
            return True
        self._waiting.append(reader)
        return False

    def _release(self, reader: Reader) -> None:
        self._holders.discard(reader)
        while self._waiting and len(self._holders) < self.slots:
            nxt = self._waiting.popleft()
            if nxt.closed:
                continue
            self._holders.add(nxt)
            nxt.resume()


def _unparsed(ws: Any) -> Callable[[], int] | None:
    """How many bytes ``ws`` holds that are not yet a whole frame, if websockets says (its
    ``protocol.reader.buffer``): control frames (pongs, close) are never taken by the read
    loop, so without it their bytes would count as unread for ever."""
    buffer = getattr(getattr(getattr(ws, "protocol", None), "reader", None), "buffer", None)
    if not isinstance(buffer, bytearray):
        return None
    return buffer.__len__


class Reader:
    """What one socket has read and its read loop not yet taken (see :class:`Intake`)."""

    __slots__ = (
        "_frames",
        "_intake",
        "_last",
        "_receive",
        "_transport",
        "_unparsed",
        "closed",
        "pending",
    )

    def __init__(
        self,
        intake: Intake,
        transport: asyncio.ReadTransport,
        receive: Callable[[bytes], None],
        unparsed: Callable[[], int] | None,
    ) -> None:
        self._intake, self._transport, self._receive = intake, transport, receive
        self._unparsed = unparsed
        self._frames: Sized | None = None
        self._last: Any = None
        self.pending = 0
        self.closed = False

    def assembled(self, assembler: Any) -> None:
        """Remember the last data frame websockets hands ``assembler`` (its message queue),
        to let go of its bytes in :meth:`taken`."""
        put = assembler.put

        def remember(frame: Any) -> None:
            self._last = frame
            put(frame)

        assembler.put = remember
        self._frames = assembler.frames

    def data_received(self, data: bytes) -> None:
        """The socket read ``data``: hand it on; past :data:`LARGE` unread, take a slot or
        stop reading until one frees."""
        self.pending += len(data)
        self._receive(data)
        intake = self._intake
        if self._unread() >= LARGE and self not in intake._holders and not self.closed:
            if not intake._acquire(self):
                self._transport.pause_reading()

    def taken(self, size: int) -> None:
        """The read loop took a frame of ``size`` bytes of text: give back its slot once
        less than :data:`LARGE` is left unread."""
        self.pending = max(0, self.pending - size - _HEADER)
        if self._last is not None and self._frames is not None and not len(self._frames):
            # Every frame queued was read: the last one's bytes are a copy nobody needs.
            self._last.data = b""
            self._last = None
        if self._unread() < LARGE and self in self._intake._holders:
            self._intake._release(self)

    def _unread(self) -> int:
        # The frame being read, as websockets holds it; else the bytes counted in and out.
        return self._unparsed() if self._unparsed is not None else self.pending

    def resume(self) -> None:
        """A slot came free for this socket: read it again."""
        if not self._transport.is_closing():
            self._transport.resume_reading()

    def close(self) -> None:
        """The connection ended: free its slot, and leave the queue."""
        self.closed = True
        if self in self._intake._holders:
            self._intake._release(self)
        elif self in self._intake._waiting:
            self._intake._waiting.remove(self)
