"""What an idle peer's connection holds, and that its waits still work once let go."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bus.transports.connection import Connection
from peers.testing import running_bus, scaled


async def test_an_initialized_idle_peer_holds_no_event(tmp_path: Path) -> None:
    """Once a peer initialized and idles, its Connection holds no asyncio.Event, and its
    ``initialized`` and ``wait_closed`` still answer."""
    async with running_bus(tmp_path) as bus:
        async with bus.peer("agent:idle") as peer:
            await peer.subscribe("agent:idle")
            door = bus.bus._door
            (conn,) = [c for c in door.connections if isinstance(c, Connection)]
            held = [v for v in vars(conn).values() if isinstance(v, asyncio.Event)]
            assert held == []
            assert conn.initialized.is_set()  # made on demand, already set
            closed = asyncio.ensure_future(conn.wait_closed())
            await asyncio.sleep(0)
            assert not closed.done()
        async with asyncio.timeout(scaled(5)):
            await closed  # the peer left: the read loop ended and woke the waiter
        async with asyncio.timeout(scaled(1)):
            await conn.wait_closed()  # after the end: returns at once
