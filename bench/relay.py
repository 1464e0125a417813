"""The baseline: the least a relay must do to carry the bus's traffic, written on ``websockets``.

Same wire as the bus (JSON-RPC 2.0 text frames, ``initialize``, ``subscribe``, ``sendMessage``
answered after every subscriber's ``processMessage`` reply) and the same two hops, with nothing
else: no authentication, no authorization, no envelope validation, no audit log, no timeouts.
Subscriptions are exact topics. It parses and writes JSON with the bus's own helpers (orjson
when installed), so the comparison is of the server code, not of the JSON library.

Run it as ``python -m bench worker relay '{}'``; its first stdout line is
``listening on ws://HOST:PORT``, like ``bcpbus serve``.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
from typing import Any

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from bus.core import codec

__all__ = ["Relay", "main"]


class _Peer:
    """One relay connection: its socket and the processMessage calls awaiting its answer."""

    __slots__ = ("ids", "pending", "ws")

    def __init__(self, ws: ServerConnection) -> None:
        self.ws = ws
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.ids = itertools.count(1)


class Relay:
    """Route ``sendMessage`` to the peers subscribed to its exact topic; answer when they have."""

    def __init__(self) -> None:
        self.topics: dict[str, set[_Peer]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def handle(self, ws: ServerConnection) -> None:
        """Read one connection until it closes."""
        peer = _Peer(ws)
        try:
            async for text in ws:
                await self._receive(peer, codec.loads(text))
        except ConnectionClosed:
            pass
        finally:
            for subscribers in self.topics.values():
                subscribers.discard(peer)
            for future in peer.pending.values():
                if not future.done():
                    future.set_exception(ConnectionError("peer gone"))

    async def _receive(self, peer: _Peer, message: dict[str, Any]) -> None:
        method = message.get("method")
        if method is None:  # an answer to one of our processMessage calls
            future = peer.pending.pop(message["id"], None)
            if future is not None and not future.done():
                future.set_result(message.get("result"))
        elif method == "sendMessage":
            task = asyncio.create_task(self._send_message(peer, message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif method == "subscribe":
            self.topics.setdefault(message["params"]["topic"], set()).add(peer)
            await _answer(peer, message["id"], {"success": True})
        else:  # initialize and anything else: no checks, just an answer
            await _answer(peer, message["id"], _INITIALIZED)

    async def _send_message(self, peer: _Peer, request: dict[str, Any]) -> None:
        params = request["params"]
        targets = [t for t in self.topics.get(params["topic"], ()) if t is not peer]
        forward = {"topic": params["topic"], "payload": params["payload"]}
        if len(targets) == 1:  # the common case, without gather's bookkeeping
            results = [await self._call(targets[0], forward)]
        else:
            results = await asyncio.gather(*(self._call(t, forward) for t in targets))
        delivered = sum(isinstance(r, dict) and r.get("processed") is True for r in results)
        result = {
            "accepted": True,
            "messageId": params["payload"]["messageId"],
            "deliveredTo": delivered,
            "epoch": 0,  # the relay keeps no order; the field is there so SDK clients parse it
        }
        await _answer(peer, request["id"], result)

    async def _call(self, peer: _Peer, params: dict[str, Any]) -> Any:
        request_id = next(peer.ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        peer.pending[request_id] = future
        frame = {"jsonrpc": "2.0", "id": request_id, "method": "processMessage", "params": params}
        await peer.ws.send(codec.dumps(frame))
        return await future


# What the SDK's connect() parses: the bus's own initialize result, with nothing checked.
_INITIALIZED = {
    "serverId": "relay",
    "serverInfo": {"name": "relay", "version": "0"},
    "capabilities": {},
    "epoch": 0,
}


async def _answer(peer: _Peer, request_id: Any, result: Any) -> None:
    frame = codec.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})
    try:
        await peer.ws.send(frame)
    except ConnectionClosed:
        pass


async def main(params: dict[str, Any]) -> None:
    """Serve on 127.0.0.1 port 0 until SIGTERM or SIGINT."""
    relay = Relay()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with serve(relay.handle, "127.0.0.1", 0, compression=None, max_size=1 << 20) as server:
        host, port = next(iter(server.sockets)).getsockname()[:2]
        print(f"listening on ws://{host}:{port}", flush=True)
        await stop.wait()
