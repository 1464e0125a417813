"""What an idle peer's connection holds, and that its waits still work once let go."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from bus.transports.connection import Connection
from bus.transports.lobby import address_of, bearer_of
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


@pytest.mark.usefixtures("each_transport")
async def test_a_socket_lets_its_handshake_headers_go_and_keeps_its_token(tmp_path: Path) -> None:
    """A peer whose token came only in the handshake's Authorization header initializes with it
    (even after a failed first try), its address still shows, and once
    initialized its socket keeps neither the handshake's headers nor the door its token."""
    async with running_bus(tmp_path) as h:
        bearer = {"Authorization": f"Bearer {h.token('agent:w1')}"}
        async with connect(h.url, additional_headers=bearer) as ws:
            refused = await _call(ws, "initialize", {"clientId": "agent:*"})
            assert refused["error"]["code"] == -32602, refused
            door = h.bus._door
            (conn,) = [c for c in door.connections if isinstance(c, Connection)]
            assert bearer_of(conn.ws) is None  # its handler started: the headers went
            request = getattr(conn.ws, "request", None)  # websockets' parser keeps the object
            assert request is None or len(request.headers) == 0
            assert getattr(conn.ws, "response", None) is None
            joined = await _call(ws, "initialize", {"clientId": "agent:w1"}, 2)
            assert joined["result"]["serverInfo"]["name"] == "bcpbus", joined
            assert door.lobby.bearer(conn) is None  # initialized: the token is let go too
            assert address_of(conn.ws) == "127.0.0.1"  # listPeers' address
        await h.log.commit()
        (row,) = h.rows(event="connect")
        assert "127.0.0.1" in row["actor"], row  # the remote address, from the transport


async def _call(ws: Any, method: str, params: Any = None, request_id: int = 1) -> Any:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    await ws.send(json.dumps(message))
    async with asyncio.timeout(scaled(5)):
        return json.loads(await ws.recv())
