"""The echo agent on a real bus: configure, answer, and answer a retry without counting it."""

from __future__ import annotations

from typing import Any

from peers.examples.echo import EchoAgent, main
from peers.testing import Inbox, running_bus


async def test_echo_answers_configured_chats_once_per_message(tmp_path):
    """Unconfigured chats are refused; a retried id gets the same reply and is not counted."""
    events: list[dict[str, Any]] = []
    async with running_bus(tmp_path) as h:
        agent_peer = h.peer("agent:echo")
        agent = EchoAgent(agent_peer, out=events.append)
        replies = Inbox()
        async with agent_peer, h.peer("tg:1") as chat:
            chat.on("tg_reply")(replies)
            first = await chat.send("agent:echo", "tg_message", {"id": "m1", "text": "hi"})
            assert first.delivered_to == 0  # not configured yet
            pointed = await chat.send("agent:echo", "configure", {"talkto": "tg:2"})
            assert pointed.delivered_to == 0  # a chat may not point the agent elsewhere
            assert (await chat.send("agent:echo", "configure", {"talkto": "tg:1"})).delivered_to

            for attempt in (1, 2):
                sent = await chat.send(
                    "agent:echo",
                    "tg_message",
                    {"id": "m1", "text": "hi"},
                    message_id=f"m1.{attempt}",
                )
                assert sent.delivered_to == 1
                reply = await replies.get()
                assert reply.content == {"in_reply_to": "m1", "text": "echo 1: hi"}
                assert reply.payload["correlationId"] == f"m1.{attempt}"
            await chat.send("agent:echo", "tg_message", {"text": "no id"})
            assert (await replies.get()).content == {"text": "echo 2: no id"}
            malformed = await chat.send("agent:echo", "tg_message", {"words": "x"})
            assert malformed.delivered_to == 0
            await agent.close()
    assert [e["event"] for e in events] == ["configured", "answered", "repeated", "answered"]
    assert agent.count == 2


def test_echo_without_its_environment_says_what_to_set(monkeypatch, capsys):
    """Run by hand without BCPBUS_URL, BCPBUS_CLIENT_ID and BCPBUS_TOKEN: exit 2, one line."""
    for name in ("BCPBUS_URL", "BCPBUS_CLIENT_ID", "BCPBUS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    assert main() == 2
    assert "set BCPBUS_URL, BCPBUS_CLIENT_ID and BCPBUS_TOKEN" in capsys.readouterr().err
