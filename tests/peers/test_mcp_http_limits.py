"""`bcpbus mcp --http` holds sockets that send nothing no longer than its header timeout, and no
more of them per address than its cap, while an MCP host still gets in."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest

pytest.importorskip("mcp")

from mcp import Client  # noqa: E402

from peers.mcp.bridge import Bridge  # noqa: E402
from peers.mcp.server import Closed, Notifier, http_server  # noqa: E402
from peers.testing import running_bcp, scaled  # noqa: E402
from schemas.agents import build_channels, load_agents  # noqa: E402

from .test_mcp import AGENTS  # noqa: E402

CHANNELS = build_channels(load_agents(AGENTS))


@contextlib.asynccontextmanager
async def serving(
    tmp_path: object, header_timeout: float, max_per_address: int
) -> AsyncIterator[tuple[int, Closed]]:
    """A bus, a bridge for agent:main and its MCP HTTP server; the port and its counts."""
    async with running_bcp(tmp_path) as h:  # type: ignore[arg-type]
        bridge = Bridge(h.bus.peer("agent:main"), CHANNELS)
        await bridge.start()
        notifier = Notifier()
        # Listening before uvicorn starts: connections wait in the backlog until it accepts.
        sock = socket.create_server(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = http_server(
            bridge,
            notifier,
            "127.0.0.1",
            port,
            header_timeout=header_timeout,
            max_per_address=max_per_address,
        )
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            yield port, server.config.http.guard.refusals  # type: ignore[union-attr]
        finally:
            server.should_exit = True
            await task
            sock.close()
            await notifier.close()
            await bridge.close()


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """Whether the server closes the connection (EOF) before the test gives up."""
    async with asyncio.timeout(scaled(10)):
        return await reader.read(1) == b""


async def test_a_socket_that_sends_no_headers_is_closed_after_the_header_timeout(tmp_path):
    """A connection that sends nothing is closed after header_timeout and counted."""
    async with serving(tmp_path, header_timeout=0.3, max_per_address=32) as (port, closed):
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = loop.time()
        writer.write(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
        assert await closed_by_server(reader)
        assert loop.time() - started >= 0.3
        writer.close()
        assert closed.total["header_timeout"] == 1


async def test_idle_sockets_past_the_cap_cannot_keep_an_mcp_host_out(tmp_path):
    """Past max_per_address, the oldest socket waiting for headers is closed, so an MCP host
    on the same address still lists its tools."""
    async with serving(tmp_path, header_timeout=scaled(30), max_per_address=3) as (port, closed):
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        assert await closed_by_server(idle[0][0])  # the fourth closed the first
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            assert (await client.list_tools()).tools
        assert closed.total["anonymous_cap"] >= 2
        for _, writer in idle:
            writer.close()
