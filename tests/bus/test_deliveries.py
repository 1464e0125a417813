"""A message's deliveries to many subscribers: one timer for all, each with its own outcome."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.uri import parse_uri

from bus.core.policy import Policy
from bus.ops.config import Limits
from peers import Message
from peers.errors import RequestRefused
from peers.testing import BusHarness, Inbox, running_bus, scaled

pytestmark = pytest.mark.usefixtures("each_transport")
"""Every test here runs on both WebSocket transports (tests/bus/conftest.py)."""

POLICY = Policy.from_yaml(
    """version: 1
roles:
  fan:
    description: Peers that publish to and subscribe to fan:*.
    members: ["fan:*"]
    send:
      - types: [agent_event]
        topics: ["fan:*"]
    subscribe: ["fan:*"]
"""
)


async def test_one_stuck_subscriber_times_out_alone(tmp_path):
    """With one timer for the whole fan-out, the stuck target ends as timeout and the others
    count as processed, each with its own process_finish row."""
    never = asyncio.Event()

    async def stuck(message: Message) -> None:
        await never.wait()

    limits = Limits(process_timeout=scaled(0.5))
    async with running_bus(tmp_path, policy=POLICY, limits=limits) as h:
        async with (
            h.peer("fan:pub") as pub,
            h.peer("fan:a") as a,
            h.peer("fan:b") as b,
            h.peer("fan:c") as c,
        ):
            a.handle(None, stuck)
            b_inbox, c_inbox = Inbox(), Inbox()
            b.handle(None, b_inbox)
            c.handle(None, c_inbox)
            for peer in (a, b, c):
                await peer.subscribe("fan:x")
            result = await pub.send("fan:x", "agent_event", {}, message_id="m1")
            assert result.delivered_to == 2
            never.set()
        rows = {r["actor"]: r["status"] for r in h.rows(event="process_finish", message_id="m1")}
        assert rows == {"fan:a": "timeout", "fan:b": "processed", "fan:c": "processed"}
        [finish] = h.rows(event="send_finish", message_id="m1")
        assert finish["status"] == "delivered 2/3"


async def test_fan_out_frames_carry_their_own_ids(tmp_path):
    """The params are encoded once for all targets; every subscriber still gets the whole
    message, with the epoch the sender was answered with."""
    async with running_bus(tmp_path, policy=POLICY) as h:
        async with h.peer("fan:pub") as pub, h.peer("fan:a") as a, h.peer("fan:b") as b:
            inboxes = Inbox(), Inbox()
            for peer, inbox in zip((a, b), inboxes, strict=True):
                peer.handle(None, inbox)
                await peer.subscribe("fan:*")
            sent = [await pub.send("fan:y", "agent_event", {"n": n}) for n in range(3)]
            assert [r.delivered_to for r in sent] == [2, 2, 2]
            for inbox in inboxes:
                got = [await inbox.get() for _ in range(3)]
                assert [m.content for m in got] == [{"n": 0}, {"n": 1}, {"n": 2}]
                assert [m.epoch for m in got] == [r.epoch for r in sent]


async def test_timed_out_call_gives_its_in_flight_slot_back(tmp_path):
    """A fan-out call that times out frees the target's one in-flight slot: the next message
    reaches it at once and is processed, not queued behind a slot that was never returned."""
    release = asyncio.Event()
    calls = 0

    async def first_stuck(message: Message) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            await release.wait()

    limits = Limits(max_inflight_deliveries=1, process_timeout=scaled(0.5))
    async with running_bus(tmp_path, policy=POLICY, limits=limits) as h:
        async with h.peer("fan:pub") as pub, h.peer("fan:a") as a, h.peer("fan:b") as b:
            a.handle(None, first_stuck)
            b.handle(None, Inbox())
            for peer in (a, b):
                await peer.subscribe("fan:x")
            first = await pub.send("fan:x", "agent_event", {}, message_id="m1")
            second = await pub.send("fan:x", "agent_event", {}, message_id="m2")
            assert (first.delivered_to, second.delivered_to) == (1, 2)
            release.set()
        statuses = {
            (r["message_id"], r["actor"]): r["status"] for r in h.rows(event="process_finish")
        }
        assert statuses == {
            ("m1", "fan:a"): "timeout",
            ("m1", "fan:b"): "processed",
            ("m2", "fan:a"): "processed",
            ("m2", "fan:b"): "processed",
        }


async def test_subscriber_gone_mid_fan_out_counts_as_disconnected(tmp_path):
    """A target that drops its connection before answering ends as disconnected; the sender
    is answered at once with the others' count, not after the timeout."""
    gone = asyncio.Event()
    limits = Limits(process_timeout=scaled(30))
    async with running_bus(tmp_path, policy=POLICY, limits=limits) as h:
        async with h.peer("fan:pub") as pub, h.peer("fan:b") as b:
            b.handle(None, Inbox())
            await b.subscribe("fan:x")
            async with h.peer("fan:a") as a:

                async def leave(message: Message) -> None:
                    gone.set()
                    await asyncio.Event().wait()  # never answers: the link closes first

                a.handle(None, leave)
                await a.subscribe("fan:x")
                sending = asyncio.create_task(pub.send("fan:x", "agent_event", {}, message_id="m1"))
                async with asyncio.timeout(scaled(5)):
                    await gone.wait()
            async with asyncio.timeout(scaled(5)):
                assert (await sending).delivered_to == 1
        rows = {r["actor"]: r["status"] for r in h.rows(event="process_finish", message_id="m1")}
        assert rows == {"fan:a": "disconnected", "fan:b": "processed"}


async def half_closed_subscriber(h: BusHarness, client_id: str, topic: str) -> asyncio.StreamWriter:
    """A peer subscribed to ``topic`` that sent its close frame, read the bus's answer, and then
    neither reads nor closes its TCP connection: the bus's link to it is closing (websockets
    then waits up to its 10 s close_timeout to write to it). Abort the writer's transport."""
    uri = parse_uri(h.url)
    protocol = ClientProtocol(uri)
    reader, writer = await asyncio.open_connection(uri.host, uri.port)
    frames: list[Any] = []

    async def next_frame() -> Frame:
        while not frames:
            protocol.receive_data(await reader.read(1 << 16))
            frames.extend(
                e
                for e in protocol.events_received()
                if not isinstance(e, Frame) or e.opcode in (Opcode.TEXT, Opcode.CLOSE)
            )
        return cast(Frame, frames.pop(0))

    def write() -> None:
        writer.write(b"".join(protocol.data_to_send()))

    protocol.send_request(protocol.connect())
    write()
    assert (await next_frame()).status_code == 101  # type: ignore[attr-defined]
    auth = {"token": h.token(client_id)}
    requests = [
        ("initialize", {"clientId": client_id, "auth": auth}),
        ("subscribe", {"topic": topic}),
    ]
    for method, params in requests:
        request = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        protocol.send_text(json.dumps(request).encode())
        write()
        assert "result" in json.loads((await next_frame()).data)
    protocol.send_close(1000)
    write()
    assert (await next_frame()).opcode is Opcode.CLOSE
    return writer


async def test_subscriber_in_its_closing_handshake_stalls_no_other(tmp_path):
    """A subscriber whose link is closing (it sent its close frame and reads nothing more)
    holds up neither the other subscriber's frame nor the sender's answer: both come within
    process_timeout, not after the close handshake's 10 s."""
    never = asyncio.Event()
    arrived = asyncio.Event()

    async def stuck(message: Message) -> None:
        arrived.set()
        await never.wait()

    limits = Limits(process_timeout=scaled(0.5))
    async with running_bus(tmp_path, policy=POLICY, limits=limits) as h:
        async with h.peer("fan:pub") as pub, h.peer("fan:b") as b:
            b.handle(None, stuck)
            await b.subscribe("fan:x")
            closing = await half_closed_subscriber(h, "fan:a", "fan:x")
            try:
                async with asyncio.timeout(scaled(3)):  # well under close_timeout
                    sending = asyncio.create_task(
                        pub.send("fan:x", "agent_event", {}, message_id="m1")
                    )
                    await arrived.wait()
                    assert (await sending).delivered_to == 0
            finally:
                closing.transport.abort()
                never.set()
        rows = {r["actor"]: r["status"] for r in h.rows(event="process_finish", message_id="m1")}
        assert rows["fan:b"] == "timeout"


async def test_a_row_the_log_refuses_ends_the_fan_out_with_its_error(tmp_path):
    """When the activity log refuses the process_finish rows of a fan-out (its backlog full),
    the sender is answered at once with -32006, as for any refused row, instead of waiting
    for ever on deliveries whose outcome could not be recorded."""
    answered = asyncio.Event()
    got = [asyncio.Event(), asyncio.Event()]

    def holding(arrived: asyncio.Event):
        async def handle(message: Message) -> None:
            arrived.set()
            await answered.wait()

        return handle

    async with running_bus(tmp_path, policy=POLICY) as h:
        async with h.peer("fan:pub") as pub, h.peer("fan:a") as a, h.peer("fan:b") as b:
            for peer, arrived in zip((a, b), got, strict=True):
                peer.handle(None, holding(arrived))
                await peer.subscribe("fan:x")
            sending = asyncio.create_task(pub.send("fan:x", "agent_event", {}, message_id="m1"))
            async with asyncio.timeout(scaled(5)):
                for arrived in got:
                    await arrived.wait()
            log, queue_max = h.bus.log, h.bus.log.queue_max
            log.queue_max = 0  # as if queue_max rows were waiting for the disk: rows refused
            try:
                answered.set()
                async with asyncio.timeout(scaled(5)):
                    with pytest.raises(RequestRefused) as refused:
                        await sending
            finally:
                log.queue_max = queue_max
            assert refused.value.code == -32006
