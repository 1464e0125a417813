"""Requests whose method never waits are answered by the socket's read loop, without a task."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from bus.transports.connection import Connection
from peers.testing import BusHarness, running_bus, scaled


def frame(method: str, params: Any = None, request_id: Any = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


async def exchange(ws: ClientConnection, sent: Any) -> Any:
    await ws.send(json.dumps(sent))
    async with asyncio.timeout(scaled(5)):
        return json.loads(await ws.recv())


async def initialized(h: BusHarness, client_id: str) -> ClientConnection:
    ws = await connect(h.url)
    params = {"clientId": client_id, "auth": {"token": h.token(client_id)}}
    assert "result" in await exchange(ws, frame("initialize", params))
    return ws


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The method of every request the bus's connections carried out in a task."""
    methods: list[str] = []
    answer = Connection._answer

    def counted(self: Connection, request: Any, *args: Any) -> Any:
        methods.append(request.method)
        return answer(self, request, *args)

    monkeypatch.setattr(Connection, "_answer", counted)
    return methods


async def test_methods_that_never_wait_are_answered_without_a_task(tmp_path, spawned):
    """ping, subscribe, listSubscriptions and unsubscribe get their answers with no task each;
    initialize and sendMessage still run in one."""
    async with running_bus(tmp_path) as h:
        ws = await initialized(h, "agent:w1")
        try:
            assert (await exchange(ws, frame("ping")))["result"]["pong"] is True
            subscribed = await exchange(ws, frame("subscribe", {"topic": "agent:w1"}, 2))
            assert "result" in subscribed, subscribed
            listed = await exchange(ws, frame("listSubscriptions", None, 3))
            assert "agent:w1" in json.dumps(listed["result"])
            assert "result" in await exchange(ws, frame("unsubscribe", {"topic": "agent:w1"}, 4))
        finally:
            await ws.close()
    assert spawned == ["initialize"]


async def test_a_batch_answered_at_once_is_in_effect_and_sends_still_await_commits(tmp_path):
    """A batch of a subscribe and a ping is answered in full; the subscription is in effect
    for the next send, which is answered only after its four rows are committed."""
    async with running_bus(tmp_path) as h:
        ws = await initialized(h, "agent:w1")
        sender = await initialized(h, "tg:42")
        try:
            params = {
                "topic": "agent:w1",
                "payload": {
                    "type": "tg_message",
                    "from": "tg:42",
                    "timestamp": "2026-11-23T10:00:00Z",
                    "messageId": "m1",
                    "content": {"text": "hi"},
                },
            }
            batch = [frame("subscribe", {"topic": "agent:w1"}, 1), frame("ping", None, 2)]
            answers = await exchange(ws, batch)
            assert sorted(a["id"] for a in answers if "result" in a) == [1, 2]
            sent = asyncio.ensure_future(exchange(sender, frame("sendMessage", params, 7)))
            async with asyncio.timeout(scaled(5)):
                delivered = json.loads(await ws.recv())
            assert delivered["method"] == "processMessage"
            await ws.send(
                json.dumps({"jsonrpc": "2.0", "id": delivered["id"], "result": {"processed": True}})
            )
            reply = await sent
            assert reply["result"]["deliveredTo"] == 1, reply
            events = [row["event"] for row in h.rows(message_id="m1")]
            assert events == ["send_start", "process_start", "process_finish", "send_finish"]
        finally:
            await ws.close()
            await sender.close()


async def test_a_quick_methods_error_is_answered_after_its_row(tmp_path, spawned):
    """subscribe with bad params is answered -32602, and its rpc_error row is committed by the
    time the peer reads the answer: the error, and only it, waits in a task."""
    async with running_bus(tmp_path) as h:
        ws = await initialized(h, "agent:w1")
        try:
            reply = await exchange(ws, frame("subscribe", {"topic": 5}, "bad-1"))
            assert reply["error"]["code"] == -32602, reply
            assert h.rows(event="rpc_error", rpc_id="bad-1", actor="agent:w1")
        finally:
            await ws.close()
    assert spawned == ["initialize", "subscribe"]


async def test_a_quick_method_that_breaks_is_an_internal_error(tmp_path, monkeypatch):
    """A method that never waits and raises something unexpected is answered -32603, without
    details, and the connection goes on answering."""
    async with running_bus(tmp_path) as h:

        def broken(route: Any, request: Any) -> Any:
            raise RuntimeError("secret detail")

        monkeypatch.setattr(h.bus._methods.table["ping"], "run", broken)
        ws = await initialized(h, "agent:w1")
        try:
            reply = await exchange(ws, frame("ping"))
            assert reply["error"]["code"] == -32603
            assert "secret" not in json.dumps(reply)
            listed = await exchange(ws, frame("listSubscriptions", None, 2))
            assert "result" in listed, listed
        finally:
            await ws.close()
