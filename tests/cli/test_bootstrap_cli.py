"""The bootstrap flow with real processes: `bcpbus system`, `bcpbus chat` and the echo agent the
system peer starts, on an in-process bus; the chat killed with SIGKILL and started again."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from bus.core.identities import load_identities
from peers.testing import BusHarness, running_bus, scaled

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ROOT / "agents"
BCPBUS = [str(Path(sys.executable).with_name("bcpbus"))]
ENV = {
    **{key: value for key, value in os.environ.items() if key != "BCPBUS_TOKEN"},
    "PYTHONUNBUFFERED": "1",
}

Event = dict[str, Any]


class Lines:
    """A subprocess whose stdout JSON lines are collected as they arrive."""

    def __init__(self, name: str, process: asyncio.subprocess.Process) -> None:
        self.name = name
        self.process = process
        self.events: list[Event] = []
        self.stderr = b""
        self._arrived = asyncio.Event()
        self._reader = asyncio.create_task(self._read())
        self._errors = asyncio.create_task(self._read_stderr())

    async def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        self.stderr = await self.process.stderr.read()

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            text = raw.decode().strip()
            try:
                self.events.append(json.loads(text))
            except ValueError:
                self.events.append({"event": "raw", "line": text})
            self._arrived.set()
        self._arrived.set()

    async def wait_for(self, match: Callable[[Event], bool], seconds: float = 30) -> Event:
        """The first event (of all so far) that ``match`` accepts; wait for it if need be."""
        async with asyncio.timeout(scaled(seconds)):
            while True:
                self._arrived.clear()
                for event in self.events:
                    if match(event):
                        return event
                if self._reader.done():
                    await self._errors
                    raise AssertionError(f"{self.name} ended: {self.events} {self.stderr!r}")
                await self._arrived.wait()

    def of(self, kind: str) -> list[Event]:
        return [event for event in self.events if event.get("event") == kind]

    async def write(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()

    async def exit_code(self, seconds: float = 30) -> int:
        async with asyncio.timeout(scaled(seconds)):
            code = await self.process.wait()
            await self._reader
            await self._errors
        return code


@asynccontextmanager
async def bcpbus(name: str, *args: str, cwd: Path) -> AsyncIterator[Lines]:
    """Run ``bcpbus ARGS`` with piped stdin and stdout; kill it on exit if it still runs."""
    process = await asyncio.create_subprocess_exec(
        *BCPBUS,
        *args,
        cwd=cwd,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=ENV,
    )
    lines = Lines(name, process)
    try:
        yield lines
    finally:
        if process.returncode is None:
            process.kill()
        await lines.exit_code()


def token_file(path: Path, token: str) -> Path:
    path.parent.mkdir(exist_ok=True)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def system_args(h: BusHarness, tmp_path: Path) -> list[str]:
    return [
        "system",
        "--url",
        h.url,
        "--token-file",
        str(token_file(tmp_path / "system.token", h.token("agent:system"))),
        "--agents-dir",
        str(AGENTS),
        "--tokens-dir",
        str(tmp_path / "agent-tokens"),
        "--json",
    ]


def chat_args(h: BusHarness, tmp_path: Path) -> list[str]:
    token = tmp_path / "tg42.token"
    if not token.exists():
        token_file(token, h.token("tg:42"))
    return [
        "chat",
        "tg:42",
        "--agent",
        "echo",
        "--url",
        h.url,
        "--token-file",
        str(token),
        "--db",
        str(tmp_path / "chat.db"),
        "--json",
        "--retry-initial",
        "0.1",
        "--reply-timeout",
        "30",
    ]


def answered(system: Lines) -> list[Event]:
    """The echo agent's `answered` events, passed on by the system peer."""
    events = [json.loads(e["line"]) for e in system.of("output") if e["line"].startswith("{")]
    return [event for event in events if event["event"] == "answered"]


def is_event(kind: str, **fields: Any) -> Callable[[Event], bool]:
    return lambda e: e.get("event") == kind and all(e.get(k) == v for k, v in fields.items())


async def test_a_chat_killed_mid_conversation_resumes_its_route_and_resends(tmp_path):
    """A chat killed with SIGKILL while a line is in flight and another queued resumes without a
    second spawn, resends both, and the agent answers each line exactly once."""
    async with running_bus(tmp_path, identities=load_identities(AGENTS)) as h:
        token_file(tmp_path / "agent-tokens" / "echo.token", h.token("agent:echo"))
        async with bcpbus("system", *system_args(h, tmp_path), cwd=tmp_path) as system:
            await system.wait_for(is_event("ready"))
            agent_pid = None
            try:
                async with bcpbus("chat1", *chat_args(h, tmp_path), cwd=tmp_path) as chat:
                    await chat.write("one")
                    await chat.wait_for(is_event("reply", text="echo 1: one"))
                    agent_pid = (await system.wait_for(is_event("started", agent="echo")))["pid"]
                    # The agent stops reading: "two" is sent and waits, "three" waits behind it.
                    os.kill(agent_pid, signal.SIGSTOP)
                    await chat.write("two")
                    two = (await chat.wait_for(is_event("queued", text="two")))["id"]
                    await chat.wait_for(is_event("sending", id=two, attempt=1))
                    await chat.write("three")
                    three = (await chat.wait_for(is_event("queued", text="three")))["id"]
                    chat.process.kill()
                    assert await chat.exit_code() == -signal.SIGKILL
                    spawns_before = len(chat.of("spawn_requested"))
                os.kill(agent_pid, signal.SIGCONT)

                async with bcpbus("chat2", *chat_args(h, tmp_path), cwd=tmp_path) as chat:
                    resumed = await chat.wait_for(is_event("resumed"))
                    assert resumed == {"event": "resumed", "agent": "agent:echo", "unanswered": 2}
                    await chat.wait_for(is_event("reply", id=three))
                    await chat.write("four")
                    await chat.wait_for(is_event("reply", text="echo 4: four"))
                    chat.process.stdin.close()  # type: ignore[union-attr]
                    assert await chat.exit_code() == 0  # everything answered
                    replies = Counter(e["text"] for e in chat.of("reply"))
                    resent = [e["attempt"] for e in chat.of("sending") if e["id"] == two]
                    assert not chat.of("spawn_requested")
            finally:
                if agent_pid is not None:
                    os.kill(agent_pid, signal.SIGCONT)
            system.process.send_signal(signal.SIGTERM)
            assert await system.exit_code() == 0
        exited = system.of("exited")

    # The second chat sent "two" again (a second attempt at least) and got every reply once.
    assert resent and min(resent) >= 2
    assert replies == {"echo 2: two": 1, "echo 3: three": 1, "echo 4: four": 1}
    # The agent answered each line once, whatever copies reached it.
    by_text = Counter(event["text"] for event in answered(system))
    assert by_text == {"one": 1, "two": 1, "three": 1, "four": 1}
    assert sorted(event["n"] for event in answered(system)) == [1, 2, 3, 4]
    # One agent process, one spawn on the bus (chat1's), and the agent stopped with the system.
    assert len(system.of("started")) == 1
    assert len(h.rows(event="send_start", topic="system:spawn")) == spawns_before
    assert [(e["agent"], e["pid"]) for e in exited] == [("echo", agent_pid)]


def test_chat_refuses_to_start_without_what_it_needs(tmp_path):
    """No token, or a --db that is a directory: one line naming what to give, exit code 2."""
    env = dict(ENV)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*BCPBUS, *args], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60
        )

    no_token = run("chat", "tg:1", "--agent", "echo")
    assert no_token.returncode == 2
    assert no_token.stderr.strip() == (
        "bcpbus: error: chat: give --token-file FILE, --token TOKEN or $BCPBUS_TOKEN"
    )
    (tmp_path / "adir").mkdir()
    env["BCPBUS_TOKEN"] = "bcpbus_x"
    directory = run("chat", "tg:1", "--agent", "echo", "--db", "adir")
    assert directory.returncode == 2
    assert directory.stderr.strip() == (
        "bcpbus: error: --db adir is a directory: give a file name, e.g. chat.db"
    )


async def test_chat_for_an_agent_that_cannot_start_exits_with_one_line(tmp_path):
    """`chat --agent X` for an X the system peer cannot start (no definition; no token) exits
    1 with one line saying why, instead of asking again forever; with no system peer it says
    whom it waits for."""
    async with running_bus(tmp_path, identities=load_identities(AGENTS)) as h:
        args = chat_args(h, tmp_path)
        plain = [arg for arg in args if arg != "--json"]
        async with bcpbus("chat", *args, cwd=tmp_path) as waiting:
            await waiting.write("hello")
            await waiting.wait_for(is_event("spawn_not_taken", waiting_for="agent:system"))
        async with bcpbus("system", *system_args(h, tmp_path), cwd=tmp_path) as system:
            await system.wait_for(is_event("ready"))
            for agent, error in (("nosuch", "unknown_agent"), ("echo", "no_token")):
                agent_args = [*plain, "--db", str(tmp_path / f"{agent}.db")]
                agent_args[agent_args.index("--agent") + 1] = agent
                async with bcpbus("chat", *agent_args, cwd=tmp_path) as chat:
                    await chat.write("hello")
                    assert await chat.exit_code() == 1
                last = chat.stderr.decode().strip().splitlines()[-1]
                assert last.startswith(f"bcpbus: error: agent:system cannot start agent:{agent} ")
                assert f"({error})" in last and "Traceback" not in chat.stderr.decode()
            system.process.send_signal(signal.SIGTERM)
            assert await system.exit_code() == 0
