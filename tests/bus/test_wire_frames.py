"""Every frame the bus sends a peer, checked against the JSON Schema files peers are told to trust.

Raw WebSocket peers call every method the bus serves, with good and bad params, and answer
the ``processMessage`` calls it makes; every frame they receive must validate against
``schemas/json/``: the JSON-RPC envelope, then the result, the params or the presence content.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from websockets.asyncio.client import ClientConnection, connect

from peers.testing import BusHarness, running_bus, scaled

pytestmark = pytest.mark.usefixtures("each_transport")
"""Every test here runs on both WebSocket transports (tests/bus/conftest.py)."""

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas" / "json"


def errors(name: str, instance: Any) -> list[str]:
    """What ``schemas/json/<name>.json`` finds wrong with ``instance``."""
    schema = json.loads((SCHEMAS / f"{name}.json").read_text(encoding="utf-8"))
    return [error.message for error in Draft202012Validator(schema).iter_errors(instance)]


class RawPeer:
    """A WebSocket peer that keeps every frame it receives, with the method each answers."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.frames: list[tuple[str, dict[str, Any]]] = []
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[str, asyncio.Future[dict[str, Any]]]] = {}
        self.changed = asyncio.Condition()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for text in self.ws:
            # Frames are written as UTF-8 bytes with text=True: a text frame, never a binary one.
            assert isinstance(text, str), "the bus wrote a binary frame"
            frame = json.loads(text)
            if "method" in frame:  # a processMessage call from the bus
                self.frames.append((frame["method"], frame))
                answer = {"jsonrpc": "2.0", "id": frame["id"], "result": {"processed": True}}
                await self.ws.send(json.dumps(answer))
            else:
                method, future = self._waiting.pop(frame["id"])
                self.frames.append((method, frame))
                future.set_result(frame)
            async with self.changed:
                self.changed.notify_all()

    async def pushed(self, message_type: str, client_id: str) -> None:
        """Wait until the bus pushed a presence event of ``message_type`` about ``client_id``."""

        def seen() -> bool:
            return any(
                frame["params"]["payload"]["type"] == message_type
                and frame["params"]["payload"]["content"]["clientId"] == client_id
                for method, frame in self.frames
                if method == "processMessage"
            )

        async with asyncio.timeout(scaled(5)), self.changed:
            await self.changed.wait_for(seen)

    async def call(self, method: str, params: Any = None) -> dict[str, Any]:
        """Send a request and return the bus's answer (a result or an error frame)."""
        request_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = (method, future)
        frame: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            frame["params"] = params
        await self.ws.send(json.dumps(frame))
        async with asyncio.timeout(scaled(5)):
            return await future

    async def close(self) -> None:
        await self.ws.close()
        with contextlib.suppress(Exception):
            await self._reader


@contextlib.asynccontextmanager
async def raw_peer(
    h: BusHarness, client_id: str, roles: tuple[str, ...] = ()
) -> AsyncIterator[RawPeer]:
    """A raw peer, initialized as ``client_id``."""
    async with connect(h.url) as ws:
        peer = RawPeer(ws)
        try:
            answer = await peer.call(
                "initialize", {"clientId": client_id, "auth": {"token": h.token(client_id, roles)}}
            )
            assert "result" in answer, answer
            yield peer
        finally:
            await peer.close()


def check(method: str, frame: dict[str, Any]) -> str:
    """Validate one received frame; return the schema its payload was checked against."""
    if "error" in frame:
        assert errors("jsonrpc.error", frame) == [], frame
        return "jsonrpc.error"
    if "method" in frame:
        assert errors("jsonrpc.request", frame) == [], frame
        assert errors(f"{method}.params", frame["params"]) == [], frame
        payload = frame["params"]["payload"]
        assert errors("envelope", payload) == [], payload
        if payload["type"] in ("peer_joined", "peer_left"):
            assert errors(payload["type"], payload["content"]) == [], payload
            return payload["type"]
        return f"{method}.params"
    assert errors("jsonrpc.response", frame) == [], frame
    assert errors(f"{method}.result", frame["result"]) == [], (method, frame)
    return f"{method}.result"


def envelope(sender: str, message_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "messageId": message_id,
        "type": "tg_message",
        "from": sender,
        "timestamp": "2026-11-21T20:22:35Z",
        "content": {"text": "hi"},
        **extra,
    }


async def test_every_frame_a_peer_receives_matches_the_schema_files(tmp_path):
    """Results, errors, processMessage calls and presence events all validate."""
    async with running_bus(tmp_path) as h:
        async with (
            raw_peer(h, "operator:ann") as operator,
            raw_peer(h, "agent:w1") as agent,
            raw_peer(h, "tg:42") as tg,
        ):
            await operator.call("subscribe", {"topic": "system:presence"})
            await agent.call("subscribe", {"topic": "agent:w1", "minRelevance": 0.1})
            await agent.call("listSubscriptions")
            await agent.call("ping")
            await operator.call("listPeers")
            sent = await tg.call(
                "sendMessage",
                {"topic": "agent:w1", "payload": envelope("tg:42", "m1", relevance=0.5)},
            )
            assert sent["result"]["deliveredTo"] == 1
            await agent.call("fetchMessages", {"topic": "agent:w1", "sinceEpoch": 0})
            await agent.call("unsubscribe", {"topic": "agent:w1"})
            # Error answers: refused, unknown, malformed, duplicate, not subscribed.
            await tg.call("listPeers")
            await tg.call("noSuchMethod")
            await tg.call("subscribe", {"topic": "a::b"})
            await tg.call("sendMessage", {"topic": "agent:w1", "payload": envelope("tg:42", "m1")})
            await agent.call("unsubscribe", {"topic": "agent:w1"})
            await agent.call("initialize", {"clientId": "agent:w1"})
            async with raw_peer(h, "agent:w2"):
                await operator.pushed("peer_joined", "agent:w2")
            await operator.pushed("peer_left", "agent:w2")
            frames = [*operator.frames, *agent.frames, *tg.frames]
        seen = {check(method, frame) for method, frame in frames}
    assert seen >= {
        "initialize.result",
        "subscribe.result",
        "unsubscribe.result",
        "listSubscriptions.result",
        "ping.result",
        "listPeers.result",
        "sendMessage.result",
        "fetchMessages.result",
        "processMessage.params",
        "jsonrpc.error",
        "peer_joined",
        "peer_left",
    }, seen


def test_the_check_catches_a_frame_the_schema_refuses():
    """A ping result without serverTime, or an error with an extra member, does not pass."""
    with pytest.raises(AssertionError):
        check("ping", {"jsonrpc": "2.0", "id": 1, "result": {"pong": True}})
    with pytest.raises(AssertionError):
        check("ping", {"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": "", "x": 1}})
