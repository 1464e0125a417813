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
sender finishes it, or :attr:`Intake.read_timeout` passes without the read loop taking a frame
from that socket, and the intake takes the slot back, stops reading the socket and tells
:attr:`Intake.refused` (the door closes it with 4007): a peer that stops in the middle of a
large frame cannot hold a slot for ever.

Sockets that have not initialized take no slot, and stop being read once they hold
:data:`ANONYMOUS_LARGE` unread; what those stopped hold (up to one read of the event loop more,
256 KiB) is counted, and past :attr:`Intake.anonymous_limit` in all the socket is refused
(``anonymous_unread``; the door closes it with 1013): a thousand of them hold a few MiB, not
the third of a GiB that a thousand reads would.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Sized
from typing import Any

__all__ = ["ANONYMOUS_LARGE", "LARGE", "Intake"]

LARGE = 64 << 10
"""Bytes of unread frames from one socket past which it needs a slot."""

ANONYMOUS_LARGE = 16 << 10
"""Bytes of unread frames past which a socket that has not initialized stops being read (an
``initialize`` frame is far smaller, so it is read whole)."""

_HEADER = 14
"""The most bytes of WebSocket framing around a frame's text (header and mask)."""


class Intake:
    """The slots for sockets reading a large frame.

    Args:
        slots: how many sockets may be reading a large frame at once (at least 1).
    """

    def __init__(self, slots: int) -> None:
        self.slots = max(1, slots)
        self.read_timeout: float | None = None
        """Seconds a socket may hold a slot without a frame taken from it; None: for ever."""
        self.anonymous_limit = max(self.slots * LARGE, 1 << 20)
        """Bytes that sockets not initialized, stopped inside a frame, may hold unread in all."""
        self.anonymous_unread = 0
        """Bytes they hold now (counted when each was stopped)."""
        self.refused: Callable[[Any, str], None] | None = None
        """Told of a socket the intake stopped reading for good, and why: ``read_timeout``
        (it held a slot that long without a frame taken) or ``anonymous_unread`` (not
        initialized, and its unread bytes would pass :attr:`anonymous_limit`). Close it;
        without this hook the intake closes the transport itself."""
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

    def watch(self, ws: Any, *, anonymous: bool = False) -> Reader | None:
        """Count what ``ws`` (a websockets connection) reads from its socket; return its
        :class:`Reader`, whose :meth:`~Reader.taken` the read loop calls for each frame it takes
        and :meth:`~Reader.close` once it ends. None for a link with no socket (in-process).

        ``anonymous``: the socket has not initialized; it takes no slot until
        :meth:`Reader.trust` (see :class:`Reader`)."""
        transport = getattr(ws, "transport", None)
        receive = getattr(ws, "data_received", None)
        if not isinstance(transport, asyncio.ReadTransport) or receive is None:
            return None
        reader = Reader(self, transport, receive, _unparsed(ws))
        reader.anonymous = anonymous
        reader.socket = ws
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
            self._hold(reader)
            return True
        self._waiting.append(reader)
        return False

    def _hold(self, reader: Reader) -> None:
        self._holders.add(reader)
        self._arm(reader)

    def _arm(self, reader: Reader) -> None:
        """(Re)start ``reader``'s clock: it has ``read_timeout`` to hand over its next frame (no
        clock while the bus is the one not reading it)."""
        if reader.timer is not None:
            reader.timer.cancel()
            reader.timer = None
        if self.read_timeout is not None and not reader.bus_waiting:
            loop = asyncio.get_running_loop()
            reader.timer = loop.call_later(self.read_timeout, self._expired, reader)

    def _release(self, reader: Reader) -> None:
        self._holders.discard(reader)
        if reader.timer is not None:
            reader.timer.cancel()
            reader.timer = None
        while self._waiting and len(self._holders) < self.slots:
            nxt = self._waiting.popleft()
            if nxt.closed:
                continue
            self._hold(nxt)
            nxt.resume()

    def _expired(self, reader: Reader) -> None:
        # The socket stopped inside its frame: the slot goes to the next, the socket is no
        # longer read (held: nothing resumes it) and is closed by its owner.
        reader.timer = None
        if reader not in self._holders or reader.closed:
            return
        reader.held = True
        reader.transport.pause_reading()
        self._release(reader)
        self._refuse(reader, "read_timeout")

    def _park(self, reader: Reader, unread: int) -> None:
        """Stop reading ``reader``, not initialized, that holds ``unread`` bytes of a frame:
        counted against :attr:`anonymous_limit`, or refused if they do not fit."""
        reader.held = True
        reader.transport.pause_reading()
        if self.anonymous_unread + unread > self.anonymous_limit:
            self._refuse(reader, "anonymous_unread")
            return
        reader.parked = unread
        self.anonymous_unread += unread

    def _unpark(self, reader: Reader) -> None:
        self.anonymous_unread -= reader.parked
        reader.parked = 0

    def _refuse(self, reader: Reader, reason: str) -> None:
        reader.closed = True  # read no more: nothing resumes it, no slot is given it
        if self.refused is not None:
            self.refused(reader.socket, reason)
        else:
            reader.transport.close()


def _unparsed(ws: Any) -> Callable[[], int] | None:
    """How many bytes ``ws`` holds that are not yet a whole frame, if websockets says (its
    ``protocol.reader.buffer``): control frames (pongs, close) are never taken by the read
    loop, so without it their bytes would count as unread for ever."""
    buffer = getattr(getattr(getattr(ws, "protocol", None), "reader", None), "buffer", None)
    if not isinstance(buffer, bytearray):
        return None
    return buffer.__len__


class Reader:
    """What one socket has read and its read loop not yet taken (see :class:`Intake`).

    A socket that has not initialized (:attr:`anonymous`) never takes a slot: its large frame
    waits, unread (past :data:`ANONYMOUS_LARGE`, counted against the intake's
    ``anonymous_limit``), until it initializes (:meth:`trust`) or ``initialize_timeout``
    closes it.
    ``initialize`` is a small frame, so a peer loses nothing; sockets that never initialize,
    sending the start of a large frame and nothing more, would otherwise hold every slot and
    stop every peer's large messages.
    """

    __slots__ = (
        "_assembler",
        "_frames",
        "_intake",
        "_last",
        "_receive",
        "_unparsed",
        "anonymous",
        "bus_waiting",
        "closed",
        "held",
        "parked",
        "pending",
        "socket",
        "timer",
        "transport",
    )

    def __init__(
        self,
        intake: Intake,
        transport: asyncio.ReadTransport,
        receive: Callable[[bytes], None],
        unparsed: Callable[[], int] | None,
    ) -> None:
        self._intake, self.transport, self._receive = intake, transport, receive
        self._unparsed = unparsed
        self._frames: Sized | None = None
        self._assembler: Any = None
        self._last: Any = None
        self.pending = 0
        self.closed = False
        self.anonymous = False
        """Not initialized yet: takes no slot."""
        self.held = False
        """Stopped by the intake (waiting for a slot, anonymous, or stalled)."""
        self.bus_waiting = False
        """The read loop takes no frame for now, waiting for the bus (:meth:`bus_waits`)."""
        self.parked = 0
        """Bytes counted in :attr:`Intake.anonymous_unread` for this socket."""
        self.socket: Any = None
        """The connection watched (what :attr:`Intake.refused` is told of)."""
        self.timer: asyncio.TimerHandle | None = None
        """Fires ``read_timeout`` after the slot was taken or a frame last taken from it."""

    def assembled(self, assembler: Any) -> None:
        """Remember the last data frame websockets hands ``assembler`` (its message queue),
        to let go of its bytes in :meth:`taken`."""
        put = assembler.put

        def remember(frame: Any) -> None:
            self._last = frame
            put(frame)

        assembler.put = remember
        self._frames = assembler.frames
        if isinstance(getattr(assembler, "paused", None), bool) and callable(
            getattr(assembler, "resume", None)
        ):
            # websockets stops reading the socket too, while its frame queue is full, on the
            # same transport: each of the two resumes it only when the other has not stopped
            # it, or a socket waiting for a slot would read its large frame anyway, and one
            # given a slot would read past the queue (max_inflight_requests' backpressure).
            resume = assembler.resume

            def resume_unless_waiting() -> None:
                if not self.held:
                    resume()

            assembler.resume = resume_unless_waiting
            self._assembler = assembler

    def data_received(self, data: bytes) -> None:
        """The socket read ``data``: hand it on; past :data:`LARGE` unread, take a slot or
        stop reading until one frees."""
        self.pending += len(data)
        self._receive(data)
        intake = self._intake
        if self.held or self.closed or self in intake._holders:
            return
        unread = self._unread()
        if self.anonymous:
            if unread >= ANONYMOUS_LARGE:
                intake._park(self, unread)
        elif unread >= LARGE and not intake._acquire(self):
            self.held = True
            self.transport.pause_reading()

    def bus_waits(self, waiting: bool) -> None:
        """The read loop stops taking frames to wait for the bus (``max_inflight_requests``),
        or goes on: a slot's read deadline measures the peer, so it stops meanwhile and starts
        afresh after."""
        self.bus_waiting = waiting
        if self in self._intake._holders:
            self._intake._arm(self)

    def trust(self) -> None:
        """The socket initialized: from now on it may take a slot, and a large frame it
        was stopped in waits for one now."""
        self.anonymous = False
        self._intake._unpark(self)  # it may read its frame now, with a slot
        if self.held and not self.closed and self not in self._intake._waiting:
            if self._intake._acquire(self):
                self.resume()

    def taken(self, size: int) -> None:
        """The read loop took a frame of ``size`` bytes of text: give back its slot once
        less than :data:`LARGE` is left unread."""
        self.pending = max(0, self.pending - size - _HEADER)
        if self._last is not None and self._frames is not None and not len(self._frames):
            # Every frame queued was read: the last one's bytes are a copy nobody needs.
            self._last.data = b""
            self._last = None
        if self in self._intake._holders:
            if self._unread() < LARGE:
                self._intake._release(self)
            else:
                self._intake._arm(self)  # a frame came whole: the next one has its own time

    def _unread(self) -> int:
        # The frame being read, as websockets holds it; else the bytes counted in and out.
        return self._unparsed() if self._unparsed is not None else self.pending

    def resume(self) -> None:
        """A slot came free for this socket: read it again."""
        self.held = False
        if self._assembler is not None and self._assembler.paused:
            return  # its frame queue is full: websockets resumes it once the loop drains it
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def close(self) -> None:
        """The connection ended: free its slot, and leave the queue."""
        self.closed = True
        self._intake._unpark(self)
        if self in self._intake._holders:
            self._intake._release(self)
        elif self in self._intake._waiting:
            self._intake._waiting.remove(self)
