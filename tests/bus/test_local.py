"""The in-process link: the socket pair alone, then a peer on it against a real bus."""

from __future__ import annotations

import asyncio

import pytest
from websockets.exceptions import ConnectionClosed

from bus.core.errors import AuthenticationFailed, InvalidParams, ShuttingDown
from bus.transports.local import LOCAL_ADDRESS, local_pair
from peers import Peer
from peers.testing import Inbox, running_bus, scaled


async def read_all(end: object) -> list[str]:
    async with asyncio.timeout(scaled(5)):
        return [text async for text in end]  # type: ignore[attr-defined]


# The pair


async def test_text_arrives_in_order_at_the_other_end() -> None:
    left, right = local_pair()
    for n in range(3):
        await left.send(f"l{n}")
    await right.send("r0")
    await right.close()
    assert await read_all(right) == ["l0", "l1", "l2"]
    assert await read_all(left) == ["r0"]


async def test_a_reader_waiting_is_woken_by_send_and_by_close() -> None:
    left, right = local_pair()
    reading = asyncio.create_task(read_all(right))
    await asyncio.sleep(0)  # one step: the reader runs until it waits on the empty inbox
    assert right._waiter is not None
    await left.send("hello")
    await left.close(4001, "replaced")
    assert await reading == ["hello"]


async def test_close_is_seen_at_both_ends_with_one_code() -> None:
    left, right = local_pair()
    await right.close(1008, "too many errors")
    await left.close(1000)  # the second close changes nothing
    assert (left.close_code, right.close_code) == (1008, 1008)
    assert right.close_reason == "too many errors"
    for end in (left, right):
        with pytest.raises(ConnectionClosed):
            await end.send("late")
    assert left.remote_address == LOCAL_ADDRESS and left.request is None


# A peer on the bus over the link


async def test_local_peer_is_authenticated_authorized_and_logged(tmp_path) -> None:
    """A local peer initializes with its token, sends and receives like a WebSocket peer,
    is refused what the policy refuses, and every step has its rows."""
    async with running_bus(tmp_path) as h:
        token = h.token("agent:local")
        inbox = Inbox()
        local = Peer("in-process", "agent:local", token, connector=h.bus.connect_local)
        async with local, h.peer("tg:7") as tg:
            local.handle(None, inbox)
            result = await tg.send("agent:local", "tg_message", {"text": "hi"}, message_id="m-in")
            assert result.delivered_to == 1
            assert (await inbox.get()).content == {"text": "hi"}
            with pytest.raises(InvalidParams, match="may not send 'bcp_query'"):
                await local.send("agent:other", "bcp_query", {}, message_id="m-no")
        events = [row["event"] for row in h.rows(message_id="m-in")]
        assert events == ["send_start", "process_start", "process_finish", "send_finish"]
        assert h.rows(event="refused", message_id="m-no")[0]["actor"] == "agent:local"
        assert h.rows(event="connect", actor=LOCAL_ADDRESS)
        assert h.rows(event="initialize", actor="agent:local")


async def test_local_peer_with_a_wrong_token_is_refused(tmp_path) -> None:
    async with running_bus(tmp_path) as h:
        h.token("agent:local")
        local = Peer("in-process", "agent:local", "bcpbus_wrong", connector=h.bus.connect_local)
        with pytest.raises(AuthenticationFailed):
            await local.connect()
        assert await h.refused() == {"wrong_token": 1}


async def test_bus_shutdown_closes_local_links_with_1001(tmp_path) -> None:
    async with running_bus(tmp_path) as h:
        local = Peer(
            "in-process",
            "agent:local",
            h.token("agent:local"),
            connector=h.bus.connect_local,
            reconnect=False,
        )
        await local.connect()
        await h.bus.close()
        assert local._reader is not None
        done, _ = await asyncio.wait({local._reader}, timeout=scaled(5))
        assert done, "the peer's read loop did not see the close"
        assert h.rows(event="disconnect", actor="agent:local")[0]["status"] == "1001"
        with pytest.raises(ShuttingDown):
            await h.bus.connect_local()
        await local.close()
