"""Sockets that stop in the middle of a large frame, on a real bus: what they may hold of the
intake's slots and of the bus's memory (bus.transports.intake)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

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


async def test_a_peer_the_bus_stops_reading_keeps_its_slot_without_a_deadline(
    tmp_path: Path,
) -> None:
    """A peer whose next large message waits, read whole, because the bus takes no more of its
    requests (max_inflight_requests, the first one waiting on a subscriber that never answers)
    is not closed 4007 however long that lasts: frame_read_timeout measures the peer, not the
    bus. Both messages are answered, and no frame_refused row is written."""
    limits = Limits(
        max_inflight_bytes=ONE_SLOT,
        max_inflight_requests=1,
        process_timeout=scaled(1.5),
        frame_read_timeout=scaled(0.3),
    )
    async with running_bus(tmp_path, limits=limits) as h:
        async with h.peer("agent:w1") as agent:
            never = asyncio.Event()

            async def stuck(message: Delivered) -> None:
                await never.wait()

            agent.handle(None, stuck)
            sender = await initialized(h, "tg:7")
            try:
                for n in range(2):
                    payload = {
                        "messageId": f"m{n}",
                        "type": "tg_message",
                        "from": "tg:7",
                        "timestamp": "2026-11-27T08:00:00Z",
                        "content": {"text": "x" * (900 << 10)},
                    }
                    params = {"topic": "agent:w1", "payload": payload}
                    request = {"jsonrpc": "2.0", "id": 10 + n, "method": "sendMessage"}
                    await sender.send(json.dumps({**request, "params": params}))
                async with asyncio.timeout(scaled(10)):
                    answers = [json.loads(await sender.recv()) for _ in range(2)]
                assert [(a["id"], a["result"]["accepted"]) for a in answers] == [
                    (10, True),
                    (11, True),
                ]
            finally:
                never.set()
                sender.transport.abort()
    assert h.rows(event="frame_refused") == []


def each_stopped(h: BusHarness) -> asyncio.Future[None]:
    """Done once the bus has stopped reading every socket it has now (pause_reading)."""
    done = asyncio.get_running_loop().create_future()
    transports = {conn.ws.transport for conn in h.bus._door.connections}
    left = set(transports)
    for transport in transports:
        pause = transport.pause_reading

        def paused(transport: Any = transport, pause: Any = pause) -> None:
            pause()
            left.discard(transport)
            if not left and not done.done():
                done.set_result(None)

        transport.pause_reading = paused
    return done


async def test_anonymous_sockets_inside_large_frames_hold_a_bounded_number_of_bytes(
    tmp_path: Path,
) -> None:
    """Thirty sockets that have not initialized each send 200 KiB of a large frame at once:
    each stops being read past ANONYMOUS_LARGE, the ones stopped hold at most the intake's
    anonymous_limit unparsed in all, and those that would go over it are closed 1013 (counted
    as frame_refused). Before, each kept 64 KiB and one read more: 300 MiB for a thousand."""
    limits = Limits(max_inflight_bytes=ONE_SLOT, max_anonymous_per_address=None)
    async with running_bus(tmp_path, limits=limits) as h:
        intake = h.bus.byte_budget.intake
        assert intake is not None
        sockets = [await connect(h.url) for _ in range(30)]
        try:
            stopped = each_stopped(h)
            for ws in sockets:
                ws.transport.write(partial_frame(512 << 10, 200 << 10))
            readers = {conn.ws.remote_address[1]: conn._reader for conn in h.bus._door.connections}
            assert len(readers) == 30 and None not in readers.values()
            async with asyncio.timeout(scaled(10)):
                await stopped
            parked = [r for r in readers.values() if not r.closed]  # type: ignore[union-attr]
            unparsed = sum(len(r.socket.protocol.reader.buffer) for r in parked)  # type: ignore[union-attr]
            assert 0 < unparsed <= intake.anonymous_limit, (len(parked), unparsed)
            refused = [ws for ws in sockets if readers[ws.local_address[1]].closed]  # type: ignore[union-attr]
            assert refused
            async with asyncio.timeout(scaled(10)):
                for ws in refused:
                    await ws.wait_closed()
                    assert ws.close_code == 1013
        finally:
            for ws in sockets:
                ws.transport.abort()
        assert (await h.refused()).get("frame_refused") == len(refused)
