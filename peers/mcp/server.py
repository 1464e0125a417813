"""The MCP face of a :class:`~peers.mcp.bridge.Bridge`, on the official ``mcp`` SDK.

:func:`build_server` makes a low-level :class:`mcp.server.lowlevel.Server` whose tools are the
bridge's (each ``inputSchema`` is its pydantic model's JSON Schema) and whose one resource is
``bcpbus://inbox``. When the inbox changes, every host that asked is told with
``notifications/resources/updated``: a host on the handshake protocol after
``resources/subscribe``, a host on the 2026-07-28 protocol on its ``subscriptions/listen``
stream. :func:`serve_stdio` and :func:`serve_http` run it over stdio or streamable HTTP.

This module imports :mod:`mcp`, an optional dependency (``pip install 'bcpbus[mcp]'``);
:mod:`peers.mcp.command` imports it only when ``bcpbus mcp`` runs.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import socket
from typing import Any, Final

import mcp_types as types
import uvicorn
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError

from bus import __version__
from bus.ops.config import (
    DEFAULT_HTTP_HEADER_TIMEOUT,
    DEFAULT_HTTP_KEEP_ALIVE_TIMEOUT,
    DEFAULT_HTTP_MAX_ANONYMOUS_PER_ADDRESS,
    DEFAULT_HTTP_MAX_HEADER_BYTES,
)
from bus.transports.admission import ConnectionGuard, guarded_protocol

from .bridge import INBOX, Bridge
from .tools import UNTRUSTED_WARNING

__all__ = [
    "INBOX_URI",
    "Closed",
    "Notifier",
    "build_server",
    "http_server",
    "serve_http",
    "serve_stdio",
]

logger = logging.getLogger("peers.mcp")

INBOX_URI: Final = INBOX
"""The resource that shows what arrived for the peer."""

_Context = ServerRequestContext[Any, Any]


class Notifier:
    """Tells the hosts that asked when the inbox changes.

    Each change is one task that notifies every session subscribed with
    ``resources/subscribe`` and publishes one event to the ``subscriptions/listen`` streams;
    a session that cannot be reached is dropped. :meth:`close` waits for the tasks.
    """

    def __init__(self) -> None:
        self.bus = InMemorySubscriptionBus()
        """What the ``subscriptions/listen`` streams listen to."""
        self.sessions: set[ServerSession] = set()
        """Sessions that sent ``resources/subscribe`` for the inbox."""
        self._tasks: set[asyncio.Task[None]] = set()

    def changed(self) -> None:
        """Notify every listening host, in a task of its own (call it from the event loop)."""
        task = asyncio.get_running_loop().create_task(self._notify())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _notify(self) -> None:
        for session in list(self.sessions):
            try:
                await session.send_resource_updated(INBOX_URI)
            except Exception as exc:  # a host that went away: forget it, tell the others
                logger.info("dropping an MCP session that cannot be notified: %s", exc)
                self.sessions.discard(session)
        await self.bus.publish(ResourceUpdated(uri=INBOX_URI))

    async def close(self) -> None:
        """Wait (up to 5 s) for the notifications under way."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5)


def build_server(bridge: Bridge, notifier: Notifier | None = None) -> Server[Any]:
    """Return the MCP server of ``bridge``: its tools, the inbox resource, its notifications."""
    notifier = notifier or Notifier()
    bridge.inbox.listen(notifier.changed)
    handlers = _Handlers(bridge, notifier)
    return Server(
        "bcpbus",
        version=__version__,
        instructions=_instructions(bridge),
        on_list_tools=handlers.list_tools,
        on_call_tool=handlers.call_tool,
        on_list_resources=handlers.list_resources,
        on_read_resource=handlers.read_resource,
        on_subscribe_resource=handlers.subscribe,
        on_unsubscribe_resource=handlers.unsubscribe,
        on_subscriptions_listen=ListenHandler(notifier.bus),
    )


class _Handlers:
    """The server's request handlers over one bridge: tools, and the inbox as a resource."""

    def __init__(self, bridge: Bridge, notifier: Notifier) -> None:
        self.bridge = bridge
        self.notifier = notifier

    async def list_tools(self, ctx: _Context, params: types.PaginatedRequestParams | None) -> Any:
        tools = [
            types.Tool(name=t.name, description=t.description, input_schema=t.input_schema())
            for t in self.bridge.tools()
        ]
        return types.ListToolsResult(tools=tools)

    async def call_tool(self, ctx: _Context, params: types.CallToolRequestParams) -> Any:
        result = await self.bridge.call(params.name, params.arguments)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=result.text)],
            structured_content=result.data,
            is_error=result.error,
        )

    async def list_resources(
        self, ctx: _Context, params: types.PaginatedRequestParams | None
    ) -> Any:
        inbox = types.Resource(
            name="inbox",
            uri=INBOX_URI,
            mime_type="application/json",
            description="What arrived for this peer that no tool call waited for: pushes, "
            "messages on subscribed topics, late verdicts. " + UNTRUSTED_WARNING,
        )
        return types.ListResourcesResult(resources=[inbox])

    async def read_resource(self, ctx: _Context, params: types.ReadResourceRequestParams) -> Any:
        _check_uri(params.uri)
        text = json.dumps(self.bridge.snapshot(), ensure_ascii=False, indent=1)
        contents = types.TextResourceContents(
            uri=INBOX_URI, text=text, mime_type="application/json"
        )
        return types.ReadResourceResult(contents=[contents])

    async def subscribe(self, ctx: _Context, params: types.SubscribeRequestParams) -> Any:
        _check_uri(params.uri)
        self.notifier.sessions.add(ctx.session)
        return types.EmptyResult()

    async def unsubscribe(self, ctx: _Context, params: types.UnsubscribeRequestParams) -> Any:
        self.notifier.sessions.discard(ctx.session)
        return types.EmptyResult()


def _check_uri(uri: Any) -> None:
    if uri != INBOX_URI:
        raise MCPError(types.INVALID_PARAMS, f"no resource {uri!r}; try {INBOX_URI}")


def _instructions(bridge: Bridge) -> str:
    roles = " and ".join(sorted(bridge.roles)) or "a peer with no BCP channel"
    return (
        f"You are connected to a bcpbus message bus as {bridge.peer.client_id} ({roles}). "
        f"What arrives for you is in the {INBOX_URI} resource. " + UNTRUSTED_WARNING
    )


async def serve_stdio(bridge: Bridge) -> None:
    """Serve ``bridge`` to one MCP host over stdin and stdout until the host closes stdin."""
    notifier = Notifier()
    server = build_server(bridge, notifier)
    try:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        await notifier.close()


class Closed:
    """Connections the HTTP server closed under its guard's rules, counted by reason: a peer
    tool keeps no audit log, so each is a DEBUG line and a count."""

    def __init__(self) -> None:
        self.total: collections.Counter[str] = collections.Counter()
        """Closed connections by reason (``header_timeout``, ``anonymous_cap``, ``bad_request``)."""

    def count(self, reason: str, address: str) -> None:
        """Count one connection closed for ``reason``."""
        self.total[reason] += 1
        logger.debug("closed an HTTP connection from %s: %s", address, reason)


def http_server(
    bridge: Bridge,
    notifier: Notifier,
    host: str,
    port: int,
    *,
    header_timeout: float | None = DEFAULT_HTTP_HEADER_TIMEOUT,
    max_per_address: int | None = DEFAULT_HTTP_MAX_ANONYMOUS_PER_ADDRESS,
) -> uvicorn.Server:
    """Return the uvicorn server :func:`serve_http` runs, not started: ``await
    server.serve()``, set ``server.should_exit`` to stop it.

    Its connections follow the bus's HTTP rules (:mod:`bus.transports.admission`): request headers
    within ``header_timeout`` seconds of the opening or of the last response, and at most
    ``max_per_address`` connections from one address, the oldest one waiting for headers
    closed past it (the MCP endpoint has no token, so every connection counts). Without them
    a client that opens sockets and sends nothing holds them, and their slots, for ever.
    """
    app = build_server(bridge, notifier).streamable_http_app(host=host)
    guard = ConnectionGuard(Closed(), per_address=max_per_address, header_timeout=header_timeout)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="on",
        http=guarded_protocol(guard),
        h11_max_incomplete_event_size=DEFAULT_HTTP_MAX_HEADER_BYTES,
        timeout_keep_alive=DEFAULT_HTTP_KEEP_ALIVE_TIMEOUT,
    )
    return _Announcing(config)


async def serve_http(bridge: Bridge, host: str, port: int) -> None:
    """Serve ``bridge`` over streamable HTTP at ``http://host:port/mcp`` until interrupted.

    Every MCP session shares the one bus connection. On a loopback ``host`` the SDK refuses
    requests whose ``Host`` or ``Origin`` is not local (DNS rebinding). Connections follow
    the header timeout and per-address cap of :func:`http_server`.
    """
    notifier = Notifier()
    try:
        await http_server(bridge, notifier, host, port).serve()
    finally:
        await notifier.close()


class _Announcing(uvicorn.Server):
    """A uvicorn server that prints ``listening on http://HOST:PORT/mcp`` on stdout once it
    accepts connections, as ``bcpbus serve`` does: a script (or a person) waits for the line
    instead of probing the port, and ``--http 0`` tells which port it got."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        for server in self.servers:
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]
                shown = f"[{host}]" if ":" in host else host
                print(f"listening on http://{shown}:{port}/mcp", flush=True)
                return
