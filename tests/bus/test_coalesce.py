"""Writes made to one socket in one pass of the event loop go out together, and none is lost."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from bus.transports.coalesce import FLUSH_BYTES, CoalescingTransport
from bus.transports.connection import Connection
from peers.testing import running_bus, scaled


class Sink(asyncio.Protocol):
    """The reading end: every chunk as one recv gave it, and the end of the stream."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.arrived = asyncio.Event()
        self.ended = asyncio.Event()

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.arrived.set()

    def eof_received(self) -> None:
        self.ended.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended.set()

    async def read(self, size: int) -> bytes:
        async with asyncio.timeout(scaled(5)):
            while sum(map(len, self.chunks)) < size:
                self.arrived.clear()
                await self.arrived.wait()
        return b"".join(self.chunks)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[CoalescingTransport, Sink]]:
    """A coalescing transport on one end of a real socket pair, a sink on the other."""
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    transport, _ = await loop.create_connection(asyncio.Protocol, sock=ours)
    sink = Sink()
    their_transport, _ = await loop.create_connection(lambda: sink, sock=theirs)
    assert isinstance(transport, asyncio.Transport)
    yield CoalescingTransport(transport), sink
    transport.abort()
    their_transport.abort()


async def test_the_first_write_of_a_pass_goes_out_and_the_rest_together(pair):
    """The first write of a pass reaches the socket at once; the two after it are held (and
    counted as buffered), then written in one piece once the pass ends."""
    coalescing, sink = pair
    for part in (b"one ", b"two ", b"three"):
        coalescing.write(part)
    assert coalescing.get_write_buffer_size() == len(b"two three")
    assert await sink.read(13) == b"one two three"
    assert b"two three" in sink.chunks or sink.chunks == [b"one two three"]
    assert coalescing.get_write_buffer_size() == 0


async def test_enough_bytes_are_written_at_once(pair):
    """Once FLUSH_BYTES are held they go to the socket without waiting for the pass to end, so
    the transport's flow control sees them as before."""
    coalescing, sink = pair
    coalescing.write(b"a")
    coalescing.write(b"x" * (FLUSH_BYTES - 1))
    assert coalescing.get_write_buffer_size() == FLUSH_BYTES - 1
    coalescing.write(b"y")
    assert coalescing.get_write_buffer_size() == 0  # all in the kernel's buffer already
    assert await sink.read(FLUSH_BYTES + 1) == b"a" + b"x" * (FLUSH_BYTES - 1) + b"y"


async def test_close_writes_what_is_held_first(pair):
    """Bytes held when the stream is closed still reach the peer, before its end."""
    coalescing, sink = pair
    coalescing.write(b"first, ")
    coalescing.write(b"last words")
    coalescing.close()
    async with asyncio.timeout(scaled(5)):
        await sink.ended.wait()
    assert b"".join(sink.chunks) == b"first, last words"


async def test_abort_drops_what_is_held(pair):
    """An aborted stream writes nothing more, even what was held before the abort."""
    coalescing, sink = pair
    coalescing.write(b"first")
    coalescing.write(b"never")
    coalescing.abort()
    async with asyncio.timeout(scaled(5)):
        await sink.ended.wait()
    await asyncio.sleep(0)  # the pass in which the held bytes would have gone out
    assert b"never" not in b"".join(sink.chunks)


async def test_the_bus_writes_through_a_coalescing_transport(tmp_path):
    """A peer's socket on the bus writes through a coalescing transport, and ten pings in
    flight at once are all answered through it."""
    async with running_bus(tmp_path) as h:
        async with h.peer("agent:w1") as peer:
            (conn,) = [c for c in h.bus._door.connections if isinstance(c, Connection)]
            assert isinstance(conn.ws.transport, CoalescingTransport)
            answers = await asyncio.gather(*(peer.ping() for _ in range(10)))
            assert all(answer.pong for answer in answers)
