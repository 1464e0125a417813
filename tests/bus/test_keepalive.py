"""The door's one keepalive: sockets that answer pings stay, one that stops answering goes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from bus.transports import keepalive
from bus.transports.connection import Connection
from peers.testing import BusHarness, running_bus, scaled


async def test_a_peer_that_stops_answering_pings_is_closed_1011(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With pings every half second, a peer that stops reading its socket (so answers no ping)
    is closed with 1011 after a round, while a peer that answers stays open with its pongs
    timed; websockets runs no keepalive task of its own for either."""
    monkeypatch.setattr(keepalive, "PING_INTERVAL", scaled(0.5))
    async with running_bus(tmp_path, transport="websockets") as h:
        async with await _joined(h, "agent:alive") as alive, await _joined(h, "agent:dead") as dead:
            door = h.bus._door
            conns = {c.client_id: c for c in door.connections if isinstance(c, Connection)}
            assert all(conn.ws.keepalive_task is None for conn in conns.values())
            dead.transport.pause_reading()  # its pongs stop: its kernel still takes the bytes
            async with asyncio.timeout(scaled(10)):
                await conns["agent:dead"].wait_closed()
            close = conns["agent:dead"].ws.protocol.close_sent
            assert close is not None and (close.code, close.reason) == (
                1011,
                "keepalive ping timeout",
            )
            dead.transport.resume_reading()  # what the bus wrote last, then the end
            async with asyncio.timeout(scaled(5)):
                await dead.wait_closed()
            server_alive = conns["agent:alive"].ws
            assert server_alive.latency > 0  # a ping of the bus was answered
            assert conns["agent:alive"] in door.connections
            assert (await _call(alive, "ping", None, 2))["result"]["pong"] is True


async def _joined(h: BusHarness, client_id: str) -> ClientConnection:
    """A raw socket, its own pings off, initialized as ``client_id``."""
    ws = await connect(h.url, ping_interval=None)
    params = {"clientId": client_id, "auth": {"token": h.token(client_id)}}
    joined = await _call(ws, "initialize", params)
    assert "result" in joined, joined
    return ws


async def _call(ws: Any, method: str, params: Any = None, request_id: int = 1) -> Any:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    await ws.send(json.dumps(message))
    async with asyncio.timeout(scaled(5)):
        return json.loads(await ws.recv())
