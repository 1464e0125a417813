"""The SDK's failures on a real bus: each is a PeerError, with the transport's exception chained."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from pydantic import ValidationError
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosedError, InvalidStatus, InvalidURI

import peers
from bus.core import errors as bus_errors
from bus.core.errors import CLOSE_REPLACED
from bus.core.identities import PeerIdentity
from bus.ops.config import Limits
from peers import (
    ConnectFailed,
    Controller,
    InvalidURL,
    MalformedMessage,
    Message,
    Peer,
    PeerClosed,
    PeerError,
    PeerTimeout,
    Reader,
    RequestRefused,
)
from peers.errors import InvalidParams, RemoteError, SubscriptionNotFound, refused
from peers.testing import BusHarness, running_bus, scaled
from tests.cli.test_operators import arun


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class Held:
    """A handler that holds every delivery until released, so the sender's call stays open."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, message: Message) -> bool:
        self.entered.set()
        await self.release.wait()
        return True


async def test_a_closed_port_raises_connect_failed_from_the_os_error():
    """Nothing listening: ConnectFailed, a ConnectionError, caused by the OSError."""
    peer = Peer(f"ws://127.0.0.1:{closed_port()}", "agent:main", "t", reconnect=False)
    with pytest.raises(ConnectFailed) as caught:
        await peer.connect()
    assert isinstance(caught.value, ConnectionError) and caught.value.status is None
    assert isinstance(caught.value.__cause__, OSError)
    assert str(caught.value).startswith(f"cannot connect to {peer.url}: ")


@pytest.mark.parametrize("url", ["http://127.0.0.1:1", "not a url"])
async def test_a_bad_url_raises_invalid_url_from_invalid_uri(url):
    """A URL that is not ws:// or wss:// raises InvalidURL, a ValueError, from InvalidURI."""
    peer = Peer(url, "agent:main", "t", reconnect=False)
    with pytest.raises(InvalidURL) as caught:
        await peer.connect()
    assert isinstance(caught.value, ValueError) and caught.value.url == url
    assert isinstance(caught.value.__cause__, InvalidURI)


async def test_a_bus_that_answers_503_raises_connect_failed_with_the_status(tmp_path):
    """A full bus refuses the handshake with HTTP 503: ConnectFailed(status=503) from
    InvalidStatus (for a peer whose token is not in the handshake, which would pass)."""
    async with running_bus(tmp_path, limits=Limits(max_anonymous_connections=0)) as h:
        peer = h.peer("agent:main", reconnect=False, auth_header=False)
        with pytest.raises(ConnectFailed) as caught:
            await peer.connect()
        assert caught.value.status == 503 and "HTTP 503" in str(caught.value)
        assert isinstance(caught.value.__cause__, InvalidStatus)
        await peer.close()


async def test_anonymous_sockets_filling_an_address_keep_no_peer_or_tool_out(tmp_path):
    """Idle sockets fill their address's anonymous cap and one more evicts the oldest (4006);
    an SDK peer with its defaults and `bcpbus pub` from that address still get in, since the
    token rides the handshake, and evict no one."""
    limits = Limits(max_anonymous_per_address=3, initialize_timeout=scaled(120))
    async with running_bus(tmp_path, limits=limits) as h:
        idle = [await connect(h.url) for _ in range(3)]
        try:
            idle.append(await connect(h.url))
            async with asyncio.timeout(scaled(5)):
                await idle[0].wait_closed()
            assert idle[0].close_code == 4006
            async with h.peer("agent:w1", reconnect=False) as peer:
                assert (await peer.ping()).pong is True
            token = h.token("tg:42")
            code, out, err = await arun(
                *("pub", "agent:w1", "tg_message", '{"text": "hi"}', "--url", h.url),
                *("--as", "tg:42", "--token", token),
                cwd=tmp_path,
            )
            assert code == 0 and '"accepted": true' in out, err
            assert h.bus.refusals.total.get("evicted") == 1
            assert all(ws.close_code is None for ws in idle[1:])
        finally:
            for ws in idle:
                await ws.close()


async def test_a_connection_the_bus_closes_mid_request_raises_peer_closed(tmp_path):
    """The bus closes the sender (replaced) while its send waits: PeerClosed with the close
    code, from the ConnectionClosed; later calls raise it too, without a websockets class."""
    async with running_bus(tmp_path) as h:
        held = Held()
        token = h.token("tg:42")
        async with h.peer("agent:w1") as agent:
            agent.handle(None, held)
            sender = Peer(h.url, "tg:42", token, reconnect=False)
            await sender.connect()
            sending = asyncio.create_task(sender.send("agent:w1", "tg_message", {"text": "hi"}))
            try:
                async with asyncio.timeout(scaled(5)):
                    await held.entered.wait()
                async with Peer(h.url, "tg:42", token, reconnect=False):
                    with pytest.raises(PeerClosed) as caught:
                        async with asyncio.timeout(scaled(5)):
                            await sending
            finally:
                held.release.set()
            closed = caught.value
            assert closed.code == CLOSE_REPLACED and "replaced" in closed.reason
            assert isinstance(closed.__cause__, ConnectionClosedError)
            with pytest.raises(PeerClosed) as again:
                await sender.request("ping")
            assert again.value.code == CLOSE_REPLACED
            assert isinstance(again.value.__cause__, ConnectionClosedError)
            await sender.close()


async def test_an_unanswered_request_raises_peer_timeout(tmp_path):
    """No answer within request_timeout raises PeerTimeout, which is also a TimeoutError."""
    async with running_bus(tmp_path) as h:
        held = Held()
        async with (
            h.peer("agent:w1") as agent,
            h.peer("tg:42", request_timeout=0.05, reconnect=False) as sender,
        ):
            agent.handle(None, held)
            try:
                with pytest.raises(PeerTimeout) as caught:
                    await sender.send("agent:w1", "tg_message", {"text": "hi"})
            finally:
                held.release.set()
            assert isinstance(caught.value, TimeoutError)


async def test_a_request_before_connect_raises_peer_closed():
    """A call on a peer that never connected raises PeerClosed, a PeerError."""
    peer = Peer("ws://127.0.0.1:1", "agent:main", "t")
    with pytest.raises(PeerClosed) as caught:
        await peer.send("agent:x", "agent_event", {})
    assert isinstance(caught.value, PeerError) and caught.value.code is None


async def test_the_bus_refusals_are_peer_errors_with_the_bus_code(tmp_path):
    """A refusal is one PeerError subclass per code, with the code, message and data, and is
    still the bus's own class for code that catches that."""
    async with running_bus(tmp_path) as h, h.peer("tg:42") as tg:
        with pytest.raises(PeerError) as caught:
            await tg.send("agent:w1", "no_such_type", {})
        refusal = caught.value
        assert isinstance(refusal, InvalidParams) and isinstance(refusal, RequestRefused)
        assert isinstance(refusal, bus_errors.InvalidParams) and refusal.code == -32602
        assert "no_such_type" in refusal.message
        with pytest.raises(SubscriptionNotFound) as gone:
            await tg.unsubscribe("agent:nowhere")
        assert isinstance(gone.value, bus_errors.BusError) and gone.value.code == -32003


def test_refused_keeps_an_unknown_code_and_maps_a_subclass_to_its_base():
    """An unknown code stays in RemoteError.remote_code; a bus subclass the SDK has no class
    for (one defined elsewhere) becomes the class of its nearest base."""
    unknown = refused(bus_errors.BusError.from_error({"code": -32077, "message": "new"}))
    assert isinstance(unknown, RemoteError) and unknown.remote_code == -32077
    assert unknown.message == "new" and unknown.to_error()["code"] == -32077

    class Narrower(bus_errors.LimitExceeded):
        pass

    mapped = refused(Narrower("slow down", data={"retry": 1}))
    assert type(mapped) is peers.LimitExceeded and mapped.data == {"retry": 1}
    assert refused(mapped) is mapped


async def fake_gateway(h: BusHarness, reply: dict[str, Any]) -> Peer:
    """A system:gateway peer that answers every bcp: message with ``reply``'s type and content
    (its ``query_id`` and ``correlationId`` filled in), sent to the asker's agent: topic."""
    gateway = h.peer("system:gateway")

    async def answer(message: Message) -> bool:
        name = message.topic.split(":")[1 if message.type == "bcp_query_request" else 2]
        content = {**reply["content"], "query_id": message.content["query_id"]}
        await gateway.send(
            f"agent:{name}", reply["type"], content, correlation_id=message.message_id
        )
        return True

    gateway.handle(None, answer)
    await gateway.connect()
    await gateway.subscribe("bcp:*")
    return gateway


IDENTITIES = {
    "agent:main": PeerIdentity(frozenset({"controller"}), "none"),
    "agent:researcher": PeerIdentity(frozenset({"reader"}), "high"),
}


async def test_a_delivery_its_schema_refuses_fails_ask_with_malformed_message(tmp_path):
    """A bcp_response_delivery without its required fields ends ask at once with
    MalformedMessage, caused by the pydantic ValidationError."""
    bad = {"type": "bcp_response_delivery", "content": {"response": "not an object"}}
    async with running_bus(tmp_path, identities=IDENTITIES) as h:
        gateway = await fake_gateway(h, bad)
        try:
            async with Controller(h.peer("agent:main")) as main:
                with pytest.raises(MalformedMessage) as caught:
                    await main.ask("researcher", {"category": 3}, timeout=scaled(5))
        finally:
            await gateway.close()
    assert caught.value.message_type == "bcp_response_delivery"
    assert isinstance(caught.value.__cause__, ValidationError)


async def test_a_verdict_its_schema_refuses_fails_answer_with_malformed_message(tmp_path):
    """A bcp_validation_result with success but an error ends answer at once with
    MalformedMessage."""
    bad = {
        "type": "bcp_validation_result",
        "content": {"success": True, "error": "timeout"},
    }
    async with running_bus(tmp_path, identities=IDENTITIES) as h:
        gateway = await fake_gateway(h, bad)
        try:
            async with Reader(h.peer("agent:researcher")) as reader:
                with pytest.raises(MalformedMessage):
                    await reader.answer("main", "q1", {"x": 1}, timeout=scaled(5))
                assert reader.results == []
        finally:
            await gateway.close()


async def test_answer_without_a_verdict_raises_peer_timeout(tmp_path):
    """No bcp_validation_result within answer's timeout raises PeerTimeout."""
    async with running_bus(tmp_path, identities=IDENTITIES) as h:
        async with Reader(h.peer("agent:researcher")) as reader:
            with pytest.raises(PeerTimeout):
                await reader.answer("main", "q1", {"x": 1}, timeout=0.05)
