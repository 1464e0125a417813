"""Sockets that stop in the middle of a large frame, on a real bus: what they may hold of the
intake's slots and of the bus's memory (bus.transports.intake)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from websockets.asyncio.client import ClientConnection, connect

from bus.ops.config import Limits
from peers import Message as Delivered
from peers.testing import BusHarness, running_bus, scaled

ONE_SLOT = 4 << 20
"""max_inflight_bytes with one large-frame slot."""


def partial_frame(announced: int, sent: int) -> bytes:
    """The start of a masked text frame of ``announced`` bytes: its header and ``sent`` bytes."""
    header = b"\x81\xff" + announced.to_bytes(8, "big") + b"\x00\x00\x00\x00"
    return header + b" " * sent


async def initialized(h: BusHarness, client_id: str) -> ClientConnection:
    ws = await connect(h.url)
    params = {"clientId": client_id, "auth": {"token": h.token(client_id)}}
    await ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}))
    async with asyncio.timeout(scaled(5)):
        assert "result" in json.loads(await ws.recv())
    return ws


async def large_message_delivered(h: BusHarness) -> None:
    """A peer's 200 KiB message reaches its receiver (it needs a slot to be read)."""
    got: asyncio.Queue[Delivered] = asyncio.Queue()
    async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg:

        async def keep(message: Delivered) -> None:
            got.put_nowait(message)

        agent.handle(None, keep)
        async with asyncio.timeout(scaled(10)):
            await tg.send("agent:w1", "tg_message", {"text": "x" * (200 << 10)})
            delivered = await got.get()
    assert len(delivered.payload["content"]["text"]) == 200 << 10


async def test_a_peer_stalled_inside_a_large_frame_loses_its_slot_and_is_closed_4007(
    tmp_path: Path,
) -> None:
    """An initialized peer that sends 128 KiB of a 512 KiB frame and stops holds the only slot
    for frame_read_timeout at most: then it is closed with 4007, a frame_refused row says
    read_timeout, and another peer's large message is read and delivered."""
    limits = Limits(max_inflight_bytes=ONE_SLOT, frame_read_timeout=scaled(0.5))
    async with running_bus(tmp_path, limits=limits) as h:
        stalled = await initialized(h, "tg:7")
        try:
            stalled.transport.write(partial_frame(512 << 10, 128 << 10))
            async with asyncio.timeout(scaled(10)):
                await stalled.wait_closed()
            assert stalled.close_code == 4007, stalled.close_code
            await large_message_delivered(h)
        finally:
            stalled.transport.abort()
    rows = h.rows(event="frame_refused", actor="tg:7")
    assert [row["status"] for row in rows] == ["read_timeout"]


async def test_large_messages_read_in_time_are_never_cut(tmp_path: Path) -> None:
    """Six large messages in a row, each read within frame_read_timeout, all arrive, and their
    sender stays connected and writes no frame_refused row: the deadline never cuts a frame
    that keeps coming."""
    limits = Limits(max_inflight_bytes=ONE_SLOT, frame_read_timeout=scaled(2))
    async with running_bus(tmp_path, limits=limits) as h:
        got: asyncio.Queue[Delivered] = asyncio.Queue()
        async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg:

            async def keep(message: Delivered) -> None:
                got.put_nowait(message)

            agent.handle(None, keep)
            async with asyncio.timeout(scaled(30)):
                for n in range(6):
                    await tg.send("agent:w1", "tg_message", {"text": str(n) * (300 << 10)})
                    assert (await got.get()).payload["content"]["text"][0] == str(n)
            assert (await tg.ping()).pong is True
    assert h.rows(event="frame_refused") == []
