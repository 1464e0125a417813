"""`bcpbus serve --http-port` serves the console beside the gateway, through a real subprocess."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from peers.testing import scaled

BCPBUS = [str(Path(sys.executable).with_name("bcpbus"))]


async def test_serve_with_http_serves_the_console_and_an_approver_signs_in(tmp_path):
    """The console answers at /console on the HTTP port, and a token from `peers add` signs in."""
    added = await asyncio.to_thread(
        subprocess.run,
        [*BCPBUS, "peers", "add", "human:alice"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip().splitlines()[0]
    process = await asyncio.create_subprocess_exec(
        *BCPBUS,
        "serve",
        "--port",
        "0",
        "--http-port",
        "0",
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(scaled(30)):
            await process.stdout.readline()  # listening on ws://...
            http = (await process.stdout.readline()).decode().strip().removeprefix("http on ")
        async with httpx.AsyncClient(base_url=f"{http}/console") as client:
            page = await client.get("/signin")
            assert page.status_code == 200 and "Sign in" in page.text
            found = re.search(r'name="csrf" value="([^"]+)"', page.text)
            assert found is not None
            signed_in = await client.post("/signin", data={"csrf": found[1], "token": token})
            assert signed_in.status_code == 303
            approvals = await client.get("/approvals")
            assert "human:alice" in approvals.text and "Waiting for a decision" in approvals.text
    finally:
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(scaled(30)):
            code = await process.wait()
    stderr = (await process.stderr.read()).decode()  # type: ignore[union-attr]
    assert code == 0, stderr
    assert f"console: {http}/console/" in stderr


async def test_the_console_is_served_without_the_gateway_too(tmp_path):
    """With --no-gateway (a gateway in a process of its own) the console is still served, and
    serve says the gateway is off."""
    process = await asyncio.create_subprocess_exec(
        *BCPBUS,
        "serve",
        "--port",
        "0",
        "--http-port",
        "0",
        "--no-gateway",
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(scaled(30)):
            await process.stdout.readline()  # listening on ws://...
            http = (await process.stdout.readline()).decode().strip().removeprefix("http on ")
        async with httpx.AsyncClient(base_url=f"{http}/console") as client:
            assert (await client.get("/signin")).status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(scaled(30)):
            code = await process.wait()
    stderr = (await process.stderr.read()).decode()  # type: ignore[union-attr]
    assert code == 0, stderr
    assert "bcpbus: gateway: off" in stderr and f"console: {http}/console/" in stderr
