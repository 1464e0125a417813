"""A message's deliveries to many subscribers: one timer for all, each with its own outcome."""

from __future__ import annotations

import asyncio

from bus.core.policy import Policy
from bus.ops.config import Limits
from peers import Message
from peers.testing import Inbox, running_bus, scaled

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
