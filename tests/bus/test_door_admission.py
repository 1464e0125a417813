"""The WebSocket door's admission of sockets that have not initialized, over raw sockets: what
many handshakes at once, and handshakes that fail after admission, do to the anonymous caps."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket

import pytest

from bus.ops.config import Limits
from peers.testing import BusHarness, running_bus, scaled

pytestmark = pytest.mark.usefixtures("each_transport")
"""Every test here runs on both WebSocket transports (tests/bus/conftest.py)."""


def upgrade(port: int, *, key: bool = True) -> bytes:
    """An HTTP upgrade request to the bus (without Sec-WebSocket-Key: an invalid one)."""
    lines = [
        "GET / HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Version: 13",
    ]
    if key:
        lines.append("Sec-WebSocket-Key: " + base64.b64encode(os.urandom(16)).decode())
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def masked_text(text: str) -> bytes:
    """One masked text frame (a client's), of fewer than 126 bytes."""
    data = text.encode()
    assert len(data) < 126
    mask = os.urandom(4)
    return (
        bytes([0x81, 0x80 | len(data)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))
    )


async def read_exactly(sock: socket.socket, size: int) -> bytes:
    loop = asyncio.get_running_loop()
    data = b""
    while len(data) < size:
        chunk = await loop.sock_recv(sock, size - len(data))
        if not chunk:
            raise EOFError("the bus closed the connection")
        data += chunk
    return data


async def status_of(sock: socket.socket) -> int:
    """Read a handshake's answer up to its blank line and return its HTTP status."""
    loop = asyncio.get_running_loop()
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = await loop.sock_recv(sock, 1)
        if not chunk:
            break
        head += chunk
    return int(head.split(b" ", 2)[1])


async def next_frame(sock: socket.socket) -> tuple[int, bytes]:
    """The opcode and payload of the next frame the bus sends (unmasked, as a server's)."""
    first, second = await read_exactly(sock, 2)
    size = second & 0x7F
    if size == 126:
        size = int.from_bytes(await read_exactly(sock, 2), "big")
    elif size == 127:
        size = int.from_bytes(await read_exactly(sock, 8), "big")
    return first & 0x0F, await read_exactly(sock, size)


async def closed(sock: socket.socket) -> None:
    """Read (and drop) what the bus still sends until it closes the connection."""
    loop = asyncio.get_running_loop()
    while await loop.sock_recv(sock, 4096):
        pass


def raw_sockets(h: BusHarness, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", h.bus.port))
        sock.setblocking(False)
        sockets.append(sock)
    return sockets


async def still_anonymous(sock: socket.socket) -> bool:
    """Whether an open socket is still counted as not initialized (a ``ping`` before
    ``initialize`` is answered) rather than evicted (a close frame with 4006)."""
    await asyncio.get_running_loop().sock_sendall(
        sock, masked_text(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
    )
    opcode, payload = await next_frame(sock)
    if opcode == 0x8:
        assert int.from_bytes(payload[:2], "big") == 4006, payload
        return False
    assert opcode == 0x1 and "error" in json.loads(payload), payload
    return True


async def test_handshakes_at_once_from_one_address_never_pass_a_full_cap(tmp_path):
    """Eight upgrades from one address sent before the bus reads any of them, with
    max_anonymous_per_address 2: at most two sockets stay open and anonymous (the others are
    answered 503 or evicted 4006), as when they come one after another."""
    async with running_bus(tmp_path, limits=Limits(max_anonymous_per_address=2)) as h:
        sockets = raw_sockets(h, 8)
        try:
            for sock in sockets:  # all written before the bus runs: its reads come together
                sock.send(upgrade(h.bus.port))
            async with asyncio.timeout(scaled(10)):
                statuses = [await status_of(sock) for sock in sockets]
                assert set(statuses) <= {101, 503}, statuses
                opened = [s for s, status in zip(sockets, statuses, strict=True) if status == 101]
                anonymous = [await still_anonymous(sock) for sock in opened]
            assert sum(anonymous) <= 2, statuses
        finally:
            for sock in sockets:
                sock.close()


async def test_a_handshake_that_fails_after_admission_gives_its_place_back(tmp_path):
    """Upgrades admitted by the cap but invalid (no Sec-WebSocket-Key) never run a handler:
    their places go back, so two sockets then fill the cap of two without evicting anyone."""
    async with running_bus(tmp_path, limits=Limits(max_anonymous_per_address=2)) as h:
        bad = raw_sockets(h, 4)
        try:
            async with asyncio.timeout(scaled(10)):
                for sock in bad:  # one after another: each is gone before the next comes
                    await asyncio.get_running_loop().sock_sendall(
                        sock, upgrade(h.bus.port, key=False)
                    )
                    assert await status_of(sock) == 400
                    await closed(sock)
        finally:
            for sock in bad:
                sock.close()
        good = raw_sockets(h, 2)
        try:
            async with asyncio.timeout(scaled(10)):
                for sock in good:
                    await asyncio.get_running_loop().sock_sendall(sock, upgrade(h.bus.port))
                    assert await status_of(sock) == 101
                assert [await still_anonymous(sock) for sock in good] == [True, True]
        finally:
            for sock in good:
                sock.close()
        assert await h.refused() == {"rpc_error": 2}  # the two pings; no one refused, none evicted
