"""A bus closed under sockets that are still opening: mid-handshake and mid-``initialize``, every
server-side transport is closed and no task is left behind."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import warnings
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from bus.ops.config import Limits
from peers.testing import BusHarness, running_bus, scaled

pytestmark = pytest.mark.usefixtures("each_transport")
"""Every test here runs on both WebSocket transports (tests/bus/conftest.py)."""

OPENING = 20
"""Sockets of each kind left opening when the bus closes."""


async def eof(sock: socket.socket) -> None:
    """Wait until the bus closes its end of ``sock`` (reading and dropping what it sends)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            if not await loop.sock_recv(sock, 4096):
                return
        except ConnectionResetError:
            return


async def test_closing_the_bus_under_opening_sockets_closes_every_transport(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twenty sockets whose initialize is being carried out and twenty whose handshake is half
    sent when the bus closes: each of them sees the bus close its end at once (not after
    handshake_timeout), and no transport is left to the garbage collector (ResourceWarning)
    nor any task running."""
    limits = Limits(
        shutdown_grace=scaled(0.5), handshake_timeout=60, max_anonymous_per_address=None
    )
    before = asyncio.all_tasks()
    loop = asyncio.get_running_loop()
    half: list[socket.socket] = []
    joining: list[ClientConnection] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        try:
            async with running_bus(tmp_path, limits=limits) as h:
                await open_sockets(h, monkeypatch, joining, half)
                closing = loop.time()
            assert loop.time() - closing < scaled(5)  # the grace, not handshake_timeout
            async with asyncio.timeout(scaled(5)):
                for sock in half:
                    await eof(sock)
                for ws in joining:
                    await ws.wait_closed()
        finally:
            for sock in half:
                sock.close()
            for ws in joining:
                ws.transport.abort()
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []
    left = asyncio.all_tasks() - before - {asyncio.current_task()}
    assert not [task for task in left if not task.done()], left


async def open_sockets(
    h: BusHarness,
    monkeypatch: pytest.MonkeyPatch,
    joining: list[ClientConnection],
    half: list[socket.socket],
) -> None:
    """Open OPENING sockets whose initialize never ends and OPENING half-sent handshakes."""
    started = asyncio.Semaphore(0)

    async def never_joins(*args: Any, **kwargs: Any) -> Any:
        started.release()
        await asyncio.Event().wait()  # until the bus gives up on it

    monkeypatch.setattr(h.bus, "join", never_joins)
    for n in range(OPENING):
        ws = await connect(h.url)
        joining.append(ws)
        params = {"clientId": f"tg:{n}", "auth": {"token": h.token(f"tg:{n}")}}
        await ws.send(
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params})
        )
        sock = socket.create_connection(("127.0.0.1", h.bus.port))
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        sock.setblocking(False)
        half.append(sock)
    async with asyncio.timeout(scaled(10)):
        for _ in range(OPENING):
            await started.acquire()
