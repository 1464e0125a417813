"""One keepalive for every websockets socket of a door, in place of websockets' task per socket.

websockets pings each socket from a task of its own (a task, its sleep and its ping futures:
some 1.6 KiB a socket, held while the socket idles). The door runs :func:`keep_alive` once
instead, with ``ping_interval=None`` given to websockets: each round it pings every open socket,
and closes with 1011 ("keepalive ping timeout", websockets' code and reason) each socket whose
ping of the round before is still unanswered. Between rounds a socket holds nothing of it::

    task = asyncio.create_task(keep_alive(door.connections, PING_INTERVAL))
    ...
    task.cancel()

picows sockets ping themselves (picows' own timer, :mod:`bus.transports.picows_door`); other
links (in process) need no ping.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.protocol import State

from .connection import Connection

__all__ = ["PING_INTERVAL", "SLICE", "keep_alive"]

PING_INTERVAL = 20.0
"""Seconds between two pings of a socket, and how long its pong may take: websockets'
defaults (``ping_interval``, ``ping_timeout``)."""

SLICE = 64
"""Sockets pinged before the round lets the loop run (a ping costs some 20 to 150 us): a round
of 10,000 sockets in one go would hold the loop for a quarter of a second or more."""


async def keep_alive(connections: Iterable[Connection], interval: float) -> None:
    """Every ``interval`` seconds, ping each open websockets socket of ``connections`` and
    close (1011) the ones that have not answered the ping of the round before; runs until
    cancelled.

    A pong comes within ``interval`` seconds or the socket goes, as websockets' own keepalive
    with ``ping_timeout`` equal to ``ping_interval`` (its defaults) decides. Like it, this
    cannot catch a peer that reads nothing: a socket with more bytes unread than its low water
    mark is not pinged (the door's slow-consumer check closes that one).
    """
    while True:
        await asyncio.sleep(interval)
        for count, conn in enumerate(list(connections), 1):
            if count % SLICE == 0:
                await asyncio.sleep(0)  # let the loop run between slices of a large round
            ws = conn.ws
            if not isinstance(ws, ServerConnection) or ws.protocol.state is not State.OPEN:
                continue
            if ws.pending_pings:  # websockets forgets a ping once its pong came
                reason = "keepalive ping timeout"
                conn.spawn(conn.force_close(CloseCode.INTERNAL_ERROR, reason))
                continue
            if conn.write_blocked():
                continue  # its ping would wait for the peer to read: the round would stall
            try:
                # Never waits: the buffer is under its low mark, far from the pause a write
                # waits on. The pong's future is websockets' to settle; none waits on it.
                await ws.ping()
            except ConnectionClosed:
                pass  # closed in between: its handler ends on its own
