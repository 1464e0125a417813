"""The chat's side of the flow on a real bus, against a stand-in system peer and agents."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from peers.chat import Chat, ChatStore, RetrySettings
from peers.client import Message, Peer, Reply
from peers.testing import BusHarness, Events, running_bus, scaled

FAST = RetrySettings(initial=0.02, maximum=0.1, reply_timeout=0.3, respawn_after=3)


def fake_system(h: BusHarness, agent: str) -> Peer:
    """agent:system that routes every spawn request to ``agent``; queues the requests."""
    system = h.peer("agent:system")
    system.requests = asyncio.Queue()  # type: ignore[attr-defined]

    @system.on("spawn_request")
    async def spawn(message: Message) -> bool:
        system.requests.put_nowait(message)  # type: ignore[attr-defined]
        chat = message.sender
        ok = {"agent": message.content["agent"], "success": True, "status": "running"}
        await system.send(chat, "spawn_result", ok, correlation_id=message.message_id)
        await system.send(chat, "route_assigned", {"chat": chat, "agent": agent})
        return True

    return system


async def chat_run(h: BusHarness, tmp_path, events: Events) -> tuple[Chat, asyncio.Task[None]]:
    store = ChatStore.open(tmp_path / "chat.db", "tg:1")
    peer = h.peer("tg:1")
    chat = Chat(peer, store, "a1", out=events, settings=FAST)
    await peer.connect()
    return chat, asyncio.create_task(chat.run())


async def finish(chat: Chat, runner: asyncio.Task[None]) -> None:
    chat.end_of_input()
    async with asyncio.timeout(scaled(10)):
        await runner
    await chat.peer.close()
    chat.store.close()


def agent(h: BusHarness, name: str, on_message: Callable[[Peer, Message], Any]) -> Peer:
    peer = h.peer(name)
    peer.on("configure")(lambda message: _true())
    peer.on("tg_message")(lambda message: on_message(peer, message))
    return peer


async def _true() -> bool:
    return True


async def test_a_line_not_taken_is_retried_after_configuring_again_and_answered_once(tmp_path):
    """Not taken at first: retried with a new messageId and the same id, configure sent again
    before it; a second copy of the reply is reported as a duplicate, not as a reply."""
    seen: list[Message] = []

    async def on_message(peer: Peer, message: Message) -> Reply:
        seen.append(message)
        if len(seen) == 1:
            return Reply(False, "busy")
        reply = {"in_reply_to": message.content["id"], "text": "ok"}
        for _ in range(2):
            await peer.send("tg:1", "tg_reply", reply)
        return Reply(True)

    events = Events()
    async with running_bus(tmp_path) as h:
        async with fake_system(h, "agent:a1") as system, agent(h, "agent:a1", on_message):
            await system.subscribe("system:spawn")
            chat, runner = await chat_run(h, tmp_path, events)
            chat.say("hello")
            await events.wait_for("duplicate_reply")
            await finish(chat, runner)
    assert [m.content["text"] for m in seen] == ["hello", "hello"]
    assert len({m.content["id"] for m in seen}) == 1
    assert [m.message_id.rsplit(".", 1)[1] for m in seen] == ["1", "2"]
    kinds = events.kinds()
    assert kinds[:9] == [
        "queued",
        "spawn_requested",
        "spawn_result",
        "route_assigned",
        "configured",
        "sending",
        "not_delivered",
        "configured",
        "sending",
    ]
    # The agent replied (twice) before it answered the delivery.
    assert kinds[9:] == ["reply", "duplicate_reply", "delivered"]
    assert [e["text"] for e in events.seen if e["event"] == "reply"] == ["ok"]


async def test_a_line_taken_but_not_answered_is_sent_again_after_the_reply_timeout(tmp_path):
    """The agent took the line and never answered: the chat sends it again, once overdue."""
    seen: list[Message] = []

    async def on_message(peer: Peer, message: Message) -> bool:
        seen.append(message)
        if len(seen) == 2:
            await peer.send("tg:1", "tg_reply", {"in_reply_to": message.content["id"], "text": "x"})
        return True

    events = Events()
    async with running_bus(tmp_path) as h:
        async with fake_system(h, "agent:a1") as system, agent(h, "agent:a1", on_message):
            await system.subscribe("system:spawn")
            chat, runner = await chat_run(h, tmp_path, events)
            chat.say("hello")
            await events.wait_for("reply")
            await finish(chat, runner)
    assert [e["attempt"] for e in events.seen if e["event"] == "delivered"] == [1, 2]


async def test_replies_from_another_agent_are_refused_and_an_absent_agent_is_asked_for_again(
    tmp_path,
):
    """configure failing respawn_after times asks the system again (the route stays); a
    tg_reply from an agent that is not this chat's is refused."""
    events = Events()
    async with running_bus(tmp_path) as h:
        async with fake_system(h, "agent:ghost") as system, h.peer("agent:intruder") as intruder:
            await system.subscribe("system:spawn")
            chat, runner = await chat_run(h, tmp_path, events)
            async with asyncio.timeout(scaled(10)):
                for _ in range(2):
                    await system.requests.get()  # type: ignore[attr-defined]
            sent = await intruder.send("tg:1", "tg_reply", {"text": "trust me"})
            assert sent.delivered_to == 0
            async with agent(h, "agent:ghost", lambda peer, message: _true()):
                await events.wait_for("configured")
            await finish(chat, runner)
    assert events.kinds().count("not_configured") >= 3
    assert "reply" not in events.kinds()


async def test_malformed_or_misdirected_answers_are_refused(tmp_path):
    """A spawn_result or route_assigned that does not fit, or a route for another chat, is
    answered processed: false and changes nothing."""
    events = Events()
    async with running_bus(tmp_path) as h, h.peer("agent:system") as system:
        store = ChatStore.open(tmp_path / "chat.db", "tg:1")
        async with h.peer("tg:1") as peer:
            Chat(peer, store, "a1", out=events, settings=FAST)
            for message_type, content in (
                ("spawn_result", {"agent": "a1", "success": True}),
                ("route_assigned", {"chat": "tg:1"}),
                ("route_assigned", {"chat": "tg:2", "agent": "agent:a1"}),
                ("route_assigned", {"chat": "tg:1", "agent": "tg:3"}),
            ):
                sent = await system.send("tg:1", message_type, content)
                assert sent.delivered_to == 0, (message_type, content)
            assert store.route() is None
            ok = {"chat": "tg:1", "agent": "agent:a1"}
            assert (await system.send("tg:1", "route_assigned", ok)).delivered_to == 1
            async with h.peer("agent:a1") as a1:
                malformed = await a1.send("tg:1", "tg_reply", {"text": ""})
                assert malformed.delivered_to == 0
        store.close()
    assert events.kinds() == ["route_assigned"]
