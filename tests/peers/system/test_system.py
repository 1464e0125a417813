"""The system peer on a real bus: refusals a chat can act on, and agents started, shared,
restarted after they exit and stopped on close."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from peers.system import DirectoryTokens, EphemeralTokens, SystemPeer, agent_argv
from peers.testing import BusHarness, Events, Inbox, running_bus, scaled

ROOT = Path(__file__).resolve().parents[3]


def definitions(directory: Path) -> Path:
    directory.mkdir()
    echo = "command: [python, -m, peers.examples.echo]"
    for name, extra in {
        "echo": echo,
        "mute": "description: started some other way",
        "missing": "command: [./no-such-program]",
        "system": echo,
    }.items():
        (directory / f"{name}.md").write_text(f"---\nname: {name}\n{extra}\n---\nProse.\n")
    return directory


async def spawn(chat: Any, replies: Inbox, agent: str) -> dict[str, Any]:
    """Ask for ``agent``; return the spawn_result's content (route_assigned checked on success)."""
    sent = await chat.send("system:spawn", "spawn_request", {"agent": agent})
    assert sent.delivered_to == 1
    result = await replies.get_type("spawn_result", seconds=30)
    assert result.payload["correlationId"] == sent.message_id
    if result.content["success"]:
        route = await replies.get_type("route_assigned")
        assert route.content == {"chat": chat.client_id, "agent": f"agent:{agent}"}
    return result.content


def system_peer(h: BusHarness, agents: Path, tokens: Any, events: Events) -> SystemPeer:
    return SystemPeer(h.peer("agent:system"), agents, tokens, out=events, stop_timeout=scaled(5))


async def test_requests_the_system_cannot_serve_are_answered_with_a_reason(tmp_path):
    """Unknown, not startable, itself, no token, a shared token, a program that is not there,
    broken definitions: each a spawn_result with its error, paths only in the operator's log."""
    agents = definitions(tmp_path / "agents")
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    for name in ("missing", "echo"):
        (tokens / f"{name}.token").write_text("bcpbus_x")
        (tokens / f"{name}.token").chmod(0o600)
    (tokens / "echo.token").chmod(0o644)
    events = Events()
    async with running_bus(tmp_path) as h:
        system = system_peer(h, agents, DirectoryTokens(tokens), events)
        await system.start()
        replies = Inbox()
        async with h.peer("tg:1") as chat:
            chat.on(None)(replies)
            results = {
                name: await spawn(chat, replies, name)
                for name in ("nobody", "mute", "system", "missing", "echo")
            }
            (tokens / "echo.token").unlink()
            no_file = await spawn(chat, replies, "echo")
            (agents / "broken.md").write_text("---\nname: [\n---\n")
            broken = await spawn(chat, replies, "echo")
            malformed = await chat.send("system:spawn", "spawn_request", {"agent": "no spaces"})
        await system.close()
    assert {name: result["error"] for name, result in results.items()} == {
        "nobody": "unknown_agent",
        "mute": "not_spawnable",
        "system": "not_spawnable",
        "missing": "start_failed",
        "echo": "no_token",
    }
    assert no_file["error"] == "no_token" and broken["error"] == "definition_error"
    assert malformed.delivered_to == 0
    for result in (*results.values(), no_file, broken):
        assert result["success"] is False and str(tmp_path) not in result["detail"]
    refused = events.of("spawn_refused")
    assert "chmod 600" in refused[4]["detail"] and "no-such-program" in refused[3]["detail"]
    assert str(tokens / "echo.token") in refused[5]["detail"]
    assert "broken.md" in refused[6]["detail"]
    assert not events.of("started")


async def test_an_agent_is_started_once_restarted_after_it_exits_and_stopped_on_close(tmp_path):
    """Two requests share one process; after it dies the next request starts a new one; close
    stops it. The minted token is the agent's, given through the environment."""
    agents = definitions(tmp_path / "agents")
    events = Events()
    async with running_bus(tmp_path) as h:
        system = system_peer(h, agents, EphemeralTokens(h.credentials), events)
        await system.start()
        replies = Inbox()
        async with h.peer("tg:1") as chat:
            chat.on(None)(replies)
            assert (await spawn(chat, replies, "echo"))["status"] == "started"
            assert (await spawn(chat, replies, "echo"))["status"] == "running"
            first = await events.wait_for("started", seconds=30)
            ready = '{"event": "ready", "agent": "agent:echo"}'
            await events.wait_for("output", seconds=30, line=ready)
            os.kill(first["pid"], signal.SIGKILL)
            exited = await events.wait_for("exited", seconds=30)
            assert exited == {**exited, "agent": "echo", "pid": first["pid"], "returncode": -9}
            assert (await spawn(chat, replies, "echo"))["status"] == "started"
            started = events.of("started")
            await system.close()
        lifecycle = h.rows(event="send_start", topic="system:agents")
    assert len(started) == 2 and started[1]["pid"] != first["pid"]
    exits = events.of("exited")
    assert [e["pid"] for e in exits] == [first["pid"], started[1]["pid"]]
    assert len(lifecycle) == 4  # started, exited, started, exited: in the activity log


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        (("python", "-m", "x"), [sys.executable, "-m", "x"]),
        (("node", "python"), ["node", "python"]),
    ],
)
def test_a_first_word_python_is_the_interpreter_running_bcpbus(command, argv):
    """`python` first means this installation's interpreter; elsewhere it is left alone."""
    assert agent_argv(command) == argv
