"""What an operator meets from the terminal: one-line errors, help on every option, the
start-up summary, reloads, token rotation, and the pub/sub/req/peers online tools."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from bus.core.errors import CLOSE_REVOKED
from bus.ops.credentials import Credentials
from peers import Peer
from peers.client import Reply
from peers.testing import BusHarness, running_bus, scaled

BCPBUS = str(Path(sys.executable).with_name("bcpbus"))


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BCPBUS, *args], cwd=cwd, capture_output=True, text=True, timeout=scaled(60)
    )


async def arun(*args: str, cwd: Path) -> tuple[int, str, str]:
    """Run bcpbus without blocking the event loop (a bus may be running in it)."""
    process = await asyncio.create_subprocess_exec(
        BCPBUS,
        *args,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    async with asyncio.timeout(scaled(30)):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def assert_one_line_error(code: int, stderr: str, *named: str) -> str:
    """Non-zero exit, no traceback, and a last line `bcpbus: error: ...` naming ``named``."""
    assert code != 0, stderr
    assert "Traceback" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("bcpbus: error: "), stderr
    for name in named:
        assert name in last, last
    return last


# Errors a person can act on


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "adir").mkdir()
    (tmp_path / "notdb").write_text("hello, not SQLite\n")
    (tmp_path / "afile").write_text("")
    return tmp_path


ERRORS = [
    (("serve", "--port", "70000"), ("--port 70000", "65535")),
    (("serve", "--port", "0", "--db", "adir"), ("--db adir is a directory",)),
    (("serve", "--port", "0", "--db", "afile/x.db"), ("--db afile/x.db", "not a directory")),
    (("serve", "--port", "0", "--db", "notdb"), ("--db notdb is not an SQLite database",)),
    (("serve", "--port", "0", "--certfile", "afile"), ("--certfile needs --keyfile",)),
    (
        ("serve", "--port", "0", "--certfile", "afile", "--keyfile", "afile"),
        ("--certfile afile --keyfile afile: cannot load them",),
    ),
    (("audit", "--db", "notdb"), ("notdb is not an SQLite database",)),
    (("audit", "--limit", "-3"), ("--limit -3",)),
    (("demo", "--db", "adir"), ("--db adir is a directory",)),
    (("peers", "list"), ("bcpbus-peers.yaml does not exist", "peers add")),
    (("peers", "rotate", "agent:nobody"), ("agent:nobody has no token", "peers add")),
    (("gateway", "--token", "t", "--url", "foo"), ("--url foo", "ws://127.0.0.1:8765")),
    (("gateway", "--token", "t", "--url", "ws://127.0.0.1:1"), ("--url ws://127.0.0.1:1",)),
    (("gateway", "--token", "t", "--query-ttl", "-1"), ("--query-ttl -1.0",)),
    (("gateway",), ("no token", "peers add system:gateway")),
    (("budget", "reset", "main", "nobody"), ("bcp:main:nobody", "main researcher")),
    (("pub", "agent:w1", "note", "{oops", "--as", "tg:1", "--token", "t"), ("is not JSON",)),
    (("pub", "agent:*", "note", "{}", "--as", "tg:1", "--token", "t"), ("TOPIC 'agent:*'",)),
    (("sub", "tg:1", "--count", "0", "--as", "tg:1", "--token", "t"), ("--count 0",)),
    (("sub", "tg:1"), ("no clientId", "--as")),
    (("sub", "tg:1", "--as", "tg:1", "--url", "ws://127.0.0.1:1", "--token", "t"), ("--url",)),
    (("init", "taken"), ("taken/bcpbus.yaml exists already",)),
]


# One interpreter runs every case, each through the `bcpbus` entry point with its own argv,
# stderr and exit code: a process start per case would cost a second or more each.
_RUNNER = """
import contextlib, io, json, sys, traceback
from peers.cli import main
results = []
for argv in json.loads(sys.stdin.read()):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 99
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


@pytest.fixture
def mistakes(files: Path) -> list[tuple[int, str]]:
    """What `bcpbus` printed for each of ERRORS, run in one subprocess in ``files``."""
    (files / "taken").mkdir()
    (files / "taken" / "bcpbus.yaml").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("BCPBUS_TOKEN", "BCPBUS_CLIENT_ID")}
    result = subprocess.run(
        [sys.executable, "-c", _RUNNER],
        input=json.dumps([list(args) for args, _ in ERRORS]),
        cwd=files,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert result.returncode == 0, result.stderr
    return [(code, err) for code, err in json.loads(result.stdout)]


def test_each_mistake_is_one_line_naming_what_to_change(mistakes):
    """Each mistake ends in one `bcpbus: error:` line naming the option or file, a non-zero
    exit, and no traceback."""
    assert len(mistakes) == len(ERRORS)
    for (args, named), (code, stderr) in zip(ERRORS, mistakes, strict=True):
        try:
            assert_one_line_error(code, stderr, *named)
        except AssertionError as exc:
            raise AssertionError(f"bcpbus {' '.join(args)}: {exc}") from None


def test_a_port_in_use_is_named_with_what_to_do(tmp_path):
    """serve on a port another socket listens on: one line, and --port 0 is suggested."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("serve", "--port", str(port), cwd=tmp_path)
    last = assert_one_line_error(result.returncode, result.stderr, f"--port {port}")
    assert "already listens" in last and "--port 0" in last


@pytest.mark.skipif(importlib.util.find_spec("uvloop") is not None, reason="uvloop installed")
def test_no_uvloop_traceback_and_a_clear_line_when_asked_for(tmp_path):
    """Without uvloop, --loop uvloop says how to get it; no error mentions uvloop otherwise."""
    result = run("serve", "--loop", "uvloop", cwd=tmp_path)
    assert_one_line_error(result.returncode, result.stderr, "pip install 'bcpbus[speed]'")
    other = run("serve", "--port", "70000", cwd=tmp_path)
    assert "uvloop" not in other.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_database_in_a_read_only_directory(tmp_path):
    """A database path in a directory this user cannot write is named, with what to do."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        result = run("serve", "--port", "0", "--db", "locked/x.db", cwd=tmp_path)
    finally:
        locked.chmod(0o755)
    assert_one_line_error(result.returncode, result.stderr, "--db locked/x.db", "not writable")


async def test_gateway_with_a_wrong_token(tmp_path):
    """`bcpbus gateway` with a token the bus refuses: one line saying how to get a good one,
    `peers add`, naming `peers rotate` (which fails for an id not listed) only for a listed one."""
    async with running_bus(tmp_path) as h:
        h.token("system:gateway")
        code, _, err = await arun(
            "gateway", "--url", h.url, "--token", "bcpbus_wrong", "--db", "g.db", cwd=tmp_path
        )
    last = assert_one_line_error(code, err, "refused system:gateway's token", "peers add")
    assert last.count("rotate") == 1 and "rotate system:gateway` where it is listed" in last


def _walk(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.Action]]:
    found: list[tuple[str, argparse.Action]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                assert helps.get(name), f"{path} {name} has no help"
                found += _walk(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            found.append((path, action))
    return found


def test_every_command_and_option_says_what_it_does():
    """Every subcommand has a help line and every option and argument a help text."""
    from bus import cli as bus_cli
    from peers.cli import add_commands, gateway_beside

    parser = bus_cli._parser(add_commands, gateway_beside)
    actions = _walk(parser, "bcpbus")
    assert len(actions) > 60
    missing = [f"{path} {a.option_strings or a.dest}" for path, a in actions if not a.help]
    assert missing == []


# Peers: add, rotate, remove


def test_peers_add_refuses_an_existing_id_unless_rotate(tmp_path):
    """A second `peers add` of the same id is refused and the token kept; --rotate and
    `peers rotate` replace it and keep its roles."""
    first = run("peers", "add", "agent:w1", "--role", "agent", cwd=tmp_path)
    assert first.returncode == 0
    again = run("peers", "add", "agent:w1", cwd=tmp_path)
    assert_one_line_error(
        again.returncode, again.stderr, "agent:w1 already has a token", "--rotate"
    )
    credentials = Credentials.load(tmp_path / "bcpbus-peers.yaml")
    assert credentials.verify("agent:w1", first.stdout.strip()) is not None
    rotated = run("peers", "add", "agent:w1", "--rotate", cwd=tmp_path)
    assert rotated.returncode == 0 and "replaced the token" in rotated.stderr
    rotated_again = run("peers", "rotate", "agent:w1", cwd=tmp_path)
    assert rotated_again.returncode == 0
    credentials = Credentials.load(tmp_path / "bcpbus-peers.yaml")
    assert credentials.verify("agent:w1", rotated.stdout.strip()) is None
    record = credentials.verify("agent:w1", rotated_again.stdout.strip())
    assert record is not None and record.roles == ("agent",)


# serve: start-up summary, reload without a restart


@asynccontextmanager
async def serving(cwd: Path, *args: str) -> AsyncIterator[tuple[str, Any]]:
    process = await asyncio.create_subprocess_exec(
        BCPBUS,
        "serve",
        "--port",
        "0",
        *args,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(scaled(30)):
            line = (await process.stdout.readline()).decode().strip()
        assert line.startswith("listening on ws"), line
        yield line.removeprefix("listening on "), process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(scaled(30)):
            await process.wait()


async def stderr_line(process: Any, starting: str) -> str:
    """The next line of the serve process's stderr that starts with ``starting``."""
    async with asyncio.timeout(scaled(15)):
        while True:
            line = (await process.stderr.readline()).decode()
            assert line, "serve's stderr ended"
            if line.startswith(starting):
                return line.strip()


async def test_serve_summarizes_what_it_runs_with_and_warns_without_agents(tmp_path):
    """The start-up summary names the policy, peers, agents and their channels, the database
    and the log level; with an empty agents directory it warns."""
    (tmp_path / "agents").mkdir()
    async with serving(tmp_path) as (_url, process):
        process.send_signal(signal.SIGTERM)
        _, err = await process.communicate()
    text = err.decode()
    for expected in (
        "bcpbus: policy: built in",
        "bcpbus: peers: bcpbus-peers.yaml (0 peers)",
        "bcpbus: warning: no agent definitions in agents",
        "bcpbus: activity log: bcpbus.db",
        "bcpbus: checkpoints: signed with ",
        "bcpbus: log: warning and above",
    ):
        assert expected in text, text
    code, _, err = await arun("init", "site", cwd=tmp_path)
    assert code == 0, err
    async with serving(tmp_path, "--config", "site/bcpbus.yaml") as (_url, process):
        process.send_signal(signal.SIGTERM)
        _, err = await process.communicate()
    assert "main (controller with researcher), researcher (reader with main)" in err.decode()


async def test_peers_added_rotated_and_refused_policies_under_a_running_serve(tmp_path):
    """Under a running `bcpbus serve`: a peer added afterwards connects (file change), a
    rotation closes its connection with 4005, and a broken policy on SIGHUP is one line and
    changes nothing."""
    (tmp_path / "policy.yaml").write_text(
        (Path(__file__).parents[2] / "bus" / "default_policy.yaml").read_text()
    )
    async with serving(tmp_path, "--no-gateway", "--policy", "policy.yaml") as (url, process):
        code, out, _ = await arun("peers", "add", "agent:w1", cwd=tmp_path)
        assert code == 0
        await stderr_line(process, "bcpbus: reloaded")
        peer = Peer(url, "agent:w1", out.strip(), reconnect=False)
        await peer.connect()
        code, out, _ = await arun("peers", "rotate", "agent:w1", cwd=tmp_path)
        assert code == 0
        assert "1 connections revoked" in await stderr_line(process, "bcpbus: reloaded")
        async with asyncio.timeout(scaled(5)):
            await peer._runner  # reconnect=False: it ends with the connection
        assert peer._closed.code == CLOSE_REVOKED
        (tmp_path / "policy.yaml").write_text("version: 1\nroles: {}\n")
        line = await stderr_line(process, "bcpbus: reload failed")
        assert "policy.yaml" in line
        process.send_signal(signal.SIGHUP)
        assert "policy.yaml" in await stderr_line(process, "bcpbus: reload failed")
        async with Peer(url, "agent:w1", out.strip(), reconnect=False) as again:
            assert (await again.ping()).pong is True


# Terminal tools


def operator_args(h: BusHarness, client_id: str) -> list[str]:
    return ["--url", h.url, "--as", client_id, "--token", h.token(client_id)]


async def test_pub_sub_and_req_from_the_terminal(tmp_path):
    """`sub --count 2` prints two JSON lines; `pub` prints the bus's answer; `req` prints the
    reply, the message to it whose correlationId is the request's messageId."""
    async with running_bus(tmp_path) as h:
        sub = await asyncio.create_subprocess_exec(
            BCPBUS,
            "sub",
            "agent:w1",
            "--count",
            "2",
            *operator_args(h, "agent:w1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert sub.stderr is not None
        async with asyncio.timeout(scaled(30)):
            ready = (await sub.stderr.readline()).decode()
        assert ready.startswith("bcpbus: subscribed to agent:w1"), ready
        chat = operator_args(h, "tg:42")
        for text in ("one", "two"):
            code, out, err = await arun(
                "pub", "agent:w1", "tg_message", json.dumps({"text": text}), *chat, cwd=tmp_path
            )
            assert code == 0, err
            assert json.loads(out)["deliveredTo"] == 1
        async with asyncio.timeout(scaled(30)):
            out, err = await sub.communicate()
        assert sub.returncode == 0, err.decode()
        lines = [json.loads(line) for line in out.decode().splitlines()]
        assert [line["payload"]["content"]["text"] for line in lines] == ["one", "two"]
        assert lines[0]["topic"] == "agent:w1" and lines[0]["payload"]["from"] == "tg:42"

        async with h.peer("agent:w2") as agent:

            @agent.on("tg_message")
            async def answer(message: Any) -> Reply:
                await agent.send(
                    message.sender,
                    "tg_reply",
                    {"text": "pong"},
                    correlation_id=message.message_id,
                )
                return Reply(True)

            code, out, err = await arun(
                "req", "agent:w2", "tg_message", '{"text": "ping"}', *chat, cwd=tmp_path
            )
        assert code == 0, err
        reply = json.loads(out)
        assert reply["payload"]["type"] == "tg_reply" and reply["payload"]["from"] == "agent:w2"
        code, _, err = await arun(
            "req", "agent:w1", "tg_message", "{}", "--timeout", "0.3", *chat, cwd=tmp_path
        )
        assert_one_line_error(code, err, "no reply to", "correlationId")
        assert code == 1
        code, _, err = await arun(
            "pub", "tg:9", "tg_message", "{}", *operator_args(h, "agent:w3"), cwd=tmp_path
        )
        assert_one_line_error(code, err, "may not send 'tg_message' to 'tg:9'", "policy")


async def test_peers_online_lists_who_is_connected_for_operators_only(tmp_path):
    """`peers online` shows each peer with roles and subscriptions to an operator; a peer
    without an admin role is refused, with a refused row."""
    async with running_bus(tmp_path) as h, h.peer("agent:w1") as agent:
        await agent.subscribe("agent:w1")
        code, out, err = await arun(
            "peers", "online", "--json", *operator_args(h, "operator:alice"), cwd=tmp_path
        )
        assert code == 0, err
        listed = {p["clientId"]: p for p in json.loads(out)["peers"]}
        assert set(listed) == {"agent:w1", "operator:alice"}
        assert listed["agent:w1"]["roles"] == ["agent"]
        assert listed["agent:w1"]["subscriptions"] == ["agent:w1"]
        assert listed["operator:alice"]["inflight"]["requests"] == 1  # its own listPeers
        code, out, err = await arun(
            "peers", "online", *operator_args(h, "operator:alice"), cwd=tmp_path
        )
        assert code == 0 and "agent:w1" in out and "client_id" in out
        code, _, err = await arun("peers", "online", *operator_args(h, "tg:1"), cwd=tmp_path)
        assert_one_line_error(code, err, "may not call listPeers", "admin: true")
        assert h.rows(event="refused", status="admin_denied")[0]["actor"] == "tg:1"
