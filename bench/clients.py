"""The peer processes of the delivery and fan-out scenarios: a publisher and subscribers (the SDK).

Both are worker roles (``python -m bench worker publisher PARAMS``). The publisher keeps
``window`` ``sendMessage`` requests in flight and times each one from the call to the answer; the
subscribers answer every ``processMessage`` at once with ``processed: true``. Against the bus and
against the baseline relay they are the same code, so the difference is the server's.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from bus.core import codec
from peers.client import Message, Peer
from schemas.common import timestamp

from .common import emit, percentile, stdin_lines

__all__ = ["filler", "publisher", "subscribers"]


def filler(client_id: str, message_type: str, size: int) -> dict[str, Any]:
    """The ``content`` that makes the SDK's envelope about ``size`` bytes of JSON."""
    sample = {
        "messageId": uuid.uuid4().hex,
        "type": message_type,
        "from": client_id,
        "timestamp": timestamp(),
        "content": {"text": ""},
    }
    return {"text": "x" * max(0, size - len(codec.dumps(sample)))}


async def _blast(
    peer: Peer, topic: str, message_type: str, content: dict[str, Any], count: int, window: int
) -> tuple[list[float], int]:
    """Send ``count`` messages, ``window`` at a time; return their latencies and the answers
    whose ``deliveredTo`` was 0 (or that failed)."""
    latencies: list[float] = []
    misses = 0
    left = count

    async def lane() -> None:
        nonlocal left, misses
        while left > 0:
            left -= 1
            start = time.perf_counter()
            try:
                result = await peer.send(topic, message_type, content)
            except Exception:
                misses += 1
                continue
            latencies.append(time.perf_counter() - start)
            if not result.delivered_to:
                misses += 1

    async with asyncio.TaskGroup() as group:
        for _ in range(window):
            group.create_task(lane())
    return latencies, misses


async def publisher(params: dict[str, Any]) -> None:
    """Publish on command. ``run WINDOW COUNT WARMUP`` sends WARMUP messages, reports ``warm``,
    waits for ``go``, sends COUNT and reports ``done`` with the figures; ``quit`` ends."""
    peer = Peer(params["url"], params["client_id"], params["token"], reconnect=False)
    await peer.connect()
    topic, message_type = params["topic"], params["type"]
    content = filler(params["client_id"], message_type, params["payload_bytes"])
    emit("ready")
    commands = stdin_lines()
    try:
        async for words in commands:
            if words[0] == "quit":
                break
            window, count, warmup = (int(w) for w in words[1:4])
            await _blast(peer, topic, message_type, content, warmup, window)
            emit("warm")
            await anext(commands)  # go
            cpu, start = time.process_time(), time.perf_counter()
            latencies, misses = await _blast(peer, topic, message_type, content, count, window)
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
            emit(
                "done",
                elapsed=elapsed,
                cpu=cpu,
                misses=misses,
                p50=percentile(latencies, 50),
                p99=percentile(latencies, 99),
            )
    finally:
        await peer.close()


async def subscribers(params: dict[str, Any]) -> None:
    """Connect every ``[clientId, token]`` of ``peers``, subscribe each to ``topic``, count
    deliveries; ``count`` reports the total, ``quit`` ends."""
    received = 0

    async def handler(message: Message) -> None:
        nonlocal received
        received += 1

    peers = []
    for client_id, token in params["peers"]:
        peer = Peer(params["url"], client_id, token, reconnect=False)
        peer.handle(None, handler)
        peers.append(peer)
    await asyncio.gather(*(p.connect() for p in peers))
    await asyncio.gather(*(p.subscribe(params["topic"]) for p in peers))
    emit("ready")
    try:
        async for words in stdin_lines():
            if words[0] == "quit":
                break
            emit("count", received=received)
    finally:
        await asyncio.gather(*(p.close() for p in peers))
