"""A peer given several bus URLs: connecting to the first that answers, failing over on a drop."""

from __future__ import annotations

import asyncio
import socket
from contextlib import AsyncExitStack

import pytest

from peers import ConnectFailed, InvalidURL, Peer
from peers.client import ConnectionEvent, Disconnected, Reconnected
from peers.testing import BusHarness, Inbox, running_bus, scaled
from peers.urls import bus_urls


def dead_url() -> str:
    """A ws:// URL on a port nothing listens on (bound, read, released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"ws://127.0.0.1:{probe.getsockname()[1]}"


def same_peer(source: BusHarness, target: BusHarness, client_id: str) -> None:
    """Let ``target`` admit ``client_id`` with the token ``source`` has for it, as buses that
    share one peers file do."""
    record = source.credentials.record(client_id)
    assert record is not None
    target.credentials._store(record)


def test_urls_come_from_a_list_or_a_comma_string_in_order_each_once():
    """Lists, comma strings and mixes of both give the same ordered URLs; none at all is refused."""
    assert bus_urls("ws://a:1") == ("ws://a:1",)
    assert bus_urls("ws://a:1, ws://b:2,,") == ("ws://a:1", "ws://b:2")
    assert bus_urls(["ws://b:2", "ws://a:1,ws://b:2"]) == ("ws://b:2", "ws://a:1")
    with pytest.raises(InvalidURL):
        bus_urls(" , ")


async def test_connect_skips_a_bus_that_does_not_answer(tmp_path):
    """With the first URL dead, connect reaches the second and says which it is on."""
    async with running_bus(tmp_path) as h:
        token = h.token("agent:w1")
        async with Peer(f"{dead_url()},{h.url}", "agent:w1", token) as peer:
            assert peer.url == h.url and peer.urls[1] == h.url
            assert (await peer.ping()).pong is True


async def test_connect_fails_when_no_bus_answers(tmp_path):
    """Every URL dead: connect raises ConnectFailed for the last one tried."""
    first, second = dead_url(), dead_url()
    peer = Peer([first, second], "agent:w1", "bcpbus_x", reconnect=False)
    with pytest.raises(ConnectFailed) as caught:
        await peer.connect()
    assert caught.value.url == second


async def test_a_peer_fails_over_to_the_other_bus_when_its_bus_stops(tmp_path):
    """Its bus stopped, the peer reconnects to the other one, re-subscribes and is served."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    events: list[ConnectionEvent] = []
    back = asyncio.Event()

    def heard(event: ConnectionEvent) -> None:
        events.append(event)
        if isinstance(event, Reconnected):
            back.set()

    async with AsyncExitStack() as first_stack, running_bus(tmp_path / "b") as second:
        first = await first_stack.enter_async_context(running_bus(tmp_path / "a"))
        token = first.token("agent:w1")
        same_peer(first, second, "agent:w1")
        inbox = Inbox()
        peer = Peer([first.url, second.url], "agent:w1", token, on_connection=heard)
        peer.handle(None, inbox)
        async with peer:
            await peer.subscribe("agent:w1")
            assert peer.url == first.url
            await first_stack.aclose()  # the first bus stops
            async with asyncio.timeout(scaled(20)):
                await back.wait()
            assert peer.url == second.url
            assert isinstance(events[0], Disconnected) and events[0].reconnecting
            async with second.peer("tg:42") as tg:
                result = await tg.send("agent:w1", "tg_message", {"text": "after"})
            assert result.delivered_to == 1
            assert (await inbox.get()).content == {"text": "after"}
