"""`bcpbus sub` across a restart of `bcpbus serve` and a revoked token, and `bcpbus system`,
`bcpbus gateway` and `bcpbus chat` on a revoked token, all real processes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from peers.testing import scaled
from tests.cli.test_operators import BCPBUS, arun, assert_one_line_error

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@asynccontextmanager
async def bus_on(cwd: Path, port: int) -> AsyncIterator[asyncio.subprocess.Process]:
    """`bcpbus serve` on a fixed port (a restart must come back where `sub` looks)."""
    process = await asyncio.create_subprocess_exec(
        BCPBUS,
        *("serve", "--port", str(port), "--no-gateway", "--db", "bus.db"),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(scaled(30)):
            line = (await process.stdout.readline()).decode()
        assert line.startswith(f"listening on ws://127.0.0.1:{port}"), line
        yield process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(scaled(30)):
            await process.wait()


async def next_line(stream: asyncio.StreamReader) -> str:
    async with asyncio.timeout(scaled(30)):
        line = (await stream.readline()).decode()
    assert line, "the stream ended"
    return line.strip()


async def publish(cwd: Path, url: str, text: str) -> None:
    code, _, err = await arun(
        "pub",
        "agent:w1",
        "tg_message",
        json.dumps({"text": text}),
        *("--url", url, "--as", "tg:42", "--token-file", "tg42.token"),
        cwd=cwd,
    )
    assert code == 0, err


async def test_sub_reconnects_after_a_restart_and_exits_when_revoked(tmp_path):
    """`sub` says when the bus goes away and when it is back, prints what was sent meanwhile
    once each, and exits 2 with one line naming the revocation when its token is removed."""
    for client_id, file in (("agent:w1", "w1.token"), ("tg:42", "tg42.token")):
        code, out, err = await arun("peers", "add", client_id, cwd=tmp_path)
        assert code == 0, err
        (tmp_path / file).write_text(out)
    port = free_port()
    url = f"ws://127.0.0.1:{port}"
    async with bus_on(tmp_path, port) as first:
        sub = await asyncio.create_subprocess_exec(
            BCPBUS,
            *("sub", "agent:w1", "--url", url, "--as", "agent:w1", "--token-file", "w1.token"),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=ENV,
        )
        assert sub.stdout is not None and sub.stderr is not None
        try:
            assert (await next_line(sub.stderr)).startswith("bcpbus: subscribed to agent:w1")
            await publish(tmp_path, url, "before")
            assert json.loads(await next_line(sub.stdout))["payload"]["content"]["text"] == "before"
            first.send_signal(signal.SIGTERM)
            lost = await next_line(sub.stderr)
            assert lost.startswith(f"bcpbus: connection to {url} lost") and "reconnecting" in lost
        except BaseException:
            sub.kill()
            raise
    try:
        async with bus_on(tmp_path, port):
            # Sent as soon as the bus is back: to `sub` while it may still be waiting to
            # reconnect (then it is fetched by epoch), or pushed once it is back.
            await publish(tmp_path, url, "during")
            back = await next_line(sub.stderr)
            assert back.startswith(f"bcpbus: reconnected to {url}; catching up after epoch"), back
            await publish(tmp_path, url, "after")
            texts = [
                json.loads(await next_line(sub.stdout))["payload"]["content"]["text"]
                for _ in range(2)
            ]
            assert texts == ["during", "after"]
            code, _, err = await arun("peers", "remove", "agent:w1", cwd=tmp_path)
            assert code == 0, err
            async with asyncio.timeout(scaled(30)):
                out, err = await sub.communicate()
    finally:
        if sub.returncode is None:
            sub.kill()
            await sub.wait()
    last = assert_one_line_error(
        sub.returncode, err.decode(), "no longer accepts agent:w1's token", "4005", "peers add"
    )
    assert sub.returncode == 2 and "revoked" in last
    assert out == b""  # nothing printed twice


async def test_system_exits_with_one_line_when_its_token_is_revoked(tmp_path):
    """`bcpbus system` outlives nothing once the bus refuses its token: `peers remove
    agent:system` ends it with exit 2 and one line saying how to get a new one, where it used
    to wait on, connected to nothing, saying nothing."""
    code, out, err = await arun("peers", "add", "agent:system", cwd=tmp_path)
    assert code == 0, err
    (tmp_path / "system.token").write_text(out)
    (tmp_path / "agents").mkdir()
    port = free_port()
    url = f"ws://127.0.0.1:{port}"
    async with bus_on(tmp_path, port):
        system = await asyncio.create_subprocess_exec(
            BCPBUS,
            *("system", "--url", url, "--token-file", "system.token", "--agents-dir", "agents"),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=ENV,
        )
        assert system.stdout is not None
        try:
            assert (await next_line(system.stdout)).startswith("ready client_id=agent:system")
            code, _, err = await arun("peers", "remove", "agent:system", cwd=tmp_path)
            assert code == 0, err
            async with asyncio.timeout(scaled(30)):
                out, err = await system.communicate()
        finally:
            if system.returncode is None:
                system.kill()
                await system.wait()
    last = assert_one_line_error(
        system.returncode, err.decode(), "no longer accepts agent:system's token", "peers add"
    )
    assert system.returncode == 2 and "revoked" in last


async def test_a_gateway_of_its_own_exits_with_one_line_when_its_token_is_revoked(tmp_path):
    """`bcpbus gateway` beside a bus: `peers remove system:gateway` ends it with one line
    naming the refused token and exit 2, where it used to wait on, delivering nothing."""
    code, out, err = await arun("peers", "add", "system:gateway", cwd=tmp_path)
    assert code == 0, err
    (tmp_path / "gateway.token").write_text(out)
    shutil.copytree(Path(__file__).parents[2] / "agents", tmp_path / "agents")
    port = free_port()
    url = f"ws://127.0.0.1:{port}"
    async with bus_on(tmp_path, port):
        gateway = await asyncio.create_subprocess_exec(
            BCPBUS,
            *("gateway", "--url", url, "--token-file", "gateway.token", "--db", "bus.db"),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=ENV,
        )
        assert gateway.stdout is not None
        try:
            assert (await next_line(gateway.stdout)) == f"gateway connected to {url}"
            code, _, err = await arun("peers", "remove", "system:gateway", cwd=tmp_path)
            assert code == 0, err
            async with asyncio.timeout(scaled(30)):
                out, err = await gateway.communicate()
        finally:
            if gateway.returncode is None:
                gateway.kill()
                await gateway.wait()
    assert_one_line_error(gateway.returncode, err.decode(), "refused system:gateway's token")
    assert gateway.returncode == 2


async def test_a_chat_exits_with_one_line_when_its_token_is_revoked(tmp_path):
    """`bcpbus chat` waiting for an agent: `peers remove tg:42` ends it with exit 2 and one
    line saying its lines stay queued, where it used to retry into nothing, saying nothing."""
    code, out, err = await arun("peers", "add", "tg:42", cwd=tmp_path)
    assert code == 0, err
    (tmp_path / "tg42.token").write_text(out)
    port = free_port()
    url = f"ws://127.0.0.1:{port}"
    async with bus_on(tmp_path, port):
        chat = await asyncio.create_subprocess_exec(
            BCPBUS,
            *("chat", "tg:42", "--agent", "echo", "--url", url, "--token-file", "tg42.token"),
            "--json",
            cwd=tmp_path,
            stdin=subprocess.PIPE,  # kept open: the chat waits for lines
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=ENV,
        )
        assert chat.stdout is not None
        try:
            # No system peer runs: the spawn request is not taken, and the chat says so.
            while json.loads(await next_line(chat.stdout))["event"] != "spawn_not_taken":
                pass
            code, _, err = await arun("peers", "remove", "tg:42", cwd=tmp_path)
            assert code == 0, err
            async with asyncio.timeout(scaled(30)):
                out, err = await chat.communicate()
        finally:
            if chat.returncode is None:
                chat.kill()
                await chat.wait()
    [line] = [json.loads(line) for line in out.decode().splitlines() if '"error"' in line]
    assert chat.returncode == 2, err
    assert "no longer accepts tg:42's token" in line["message"] and "stay queued" in line["message"]
