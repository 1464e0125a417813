"""The bridge behind ``bcpbus mcp``: one bus connection, and the tools an MCP host calls on it.

::

    bridge = Bridge(Peer(url, "agent:main", token), channels)
    await bridge.start()
    result = await bridge.call("bcp_ask", {"reader": "researcher", "spec": {...}})
    result.text, result.data, result.error

:class:`Bridge` holds a :class:`~peers.client.Peer` and, by the peer's roles in the agent
definitions, a :class:`~peers.bcp.Controller`, a :class:`~peers.bcp.Reader` or both over it. It
knows nothing of MCP: :mod:`peers.mcp.server` lists :meth:`Bridge.tools` to the host and passes
each call to :meth:`Bridge.call`, which validates the arguments against the tool's input model
and answers every failure (a bad argument, a refusal, a lost connection) as a
:class:`ToolResult` with ``error`` set and a sentence the model can act on: a tool call never
raises into the host.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from bus.core.errors import BusError
from peers.bcp import Controller, Reader
from peers.client import Message, Peer, Reply
from peers.errors import PeerClosed, PeerError, PeerTimeout, QueryFailed
from schemas.agents import Channel
from schemas.bcp import (
    BcpQuery,
    BcpQueryRequest,
    BcpResponseDelivery,
)

from .inbox import Inbox, present
from .reader_tools import ReaderTools
from .results import ToolResult, delivery_result
from .shapes import channel_summary
from .tools import (
    TOOLS,
    AskArgs,
    FetchArgs,
    ForwardArgs,
    SendArgs,
    SubscribeArgs,
    ToolSpec,
    tools_for,
)

__all__ = ["Bridge", "ToolResult"]

logger = logging.getLogger("peers.mcp")

INBOX = "bcpbus://inbox"
"""The MCP resource that shows :attr:`Bridge.inbox`."""


class Bridge(ReaderTools):
    """One peer's bus connection, served to an MCP host as tools and an inbox.

    Args:
        peer: an unconnected peer; :meth:`start` connects it.
        channels: the BCP channels from the agent definitions (``build_channels``): the peer
            is a controller if it controls one, a reader if it reads one.
        inbox_size: entries the inbox keeps.
    """

    def __init__(
        self, peer: Peer, channels: Mapping[tuple[str, str], Channel], *, inbox_size: int = 1000
    ) -> None:
        self.peer = peer
        prefix, _, name = peer.client_id.partition(":")
        self.name = name if prefix == "agent" else None
        self.channels = [c for c in channels.values() if c.controller == self.name]
        """The channels this peer controls."""
        self.read_channels = [c for c in channels.values() if c.reader == self.name]
        roles = {"controller"} if self.channels else set()
        roles |= {"reader"} if self.read_channels else set()
        self.roles = frozenset(roles)
        """``controller`` and/or ``reader``, from the agent definitions."""
        self.inbox = Inbox(inbox_size)
        self.controller = Controller(peer) if "controller" in roles else None
        self.reader = Reader(peer) if "reader" in roles else None
        self._queries: asyncio.Queue[BcpQuery] = asyncio.Queue()
        self._asked: dict[str, BcpQuery] = {}
        """Queries handed to the model and not yet answered, by query_id."""
        self._delivered_bits: dict[str, float] = {c.reader: 0.0 for c in self.channels}
        self._ended: deque[str] = deque(maxlen=inbox_size)
        """The latest queries whose outcome this host already got: a second copy is dropped."""
        peer.handle(None, self._arrived)
        if self.controller is not None:
            self.controller.on_delivery(self._pushed)
            self.controller.on_failure(self._failed)
        if self.reader is not None:
            self.reader.on_query(self._queried)

    def tools(self) -> tuple[ToolSpec, ...]:
        """The tools this peer's host gets, by its roles."""
        return tools_for(self.roles)

    # Lifecycle

    async def start(self) -> None:
        """Connect to the bus and subscribe to the agent's own ``agent:<name>`` topic.

        Raises:
            ConnectFailed, PeerTimeout, AuthenticationFailed: as :meth:`Peer.connect`.
        """
        await self.peer.connect()
        if self.name is not None:
            await self.peer.subscribe(f"agent:{self.name}")

    async def close(self) -> None:
        """Disconnect. Idempotent."""
        await self.peer.close()

    # Calls

    async def call(self, name: str, arguments: Mapping[str, Any] | None) -> ToolResult:
        """Run tool ``name`` with ``arguments``; every failure comes back as an error result."""
        tool = TOOLS.get(name)
        if tool is None:
            return ToolResult.failed(f"no tool named {name!r}")
        if tool.role is not None and tool.role not in self.roles:
            return ToolResult.failed(
                f"{name} is a BCP {tool.role} tool, and {self.peer.client_id} is not a "
                f"{tool.role} in the agent definitions"
            )
        try:
            args = tool.args.model_validate(dict(arguments or {}))
        except ValidationError as exc:
            return ToolResult.failed(f"invalid arguments for {name}: {_problems(exc)}")
        run: Callable[[Any], Awaitable[ToolResult]] = getattr(self, f"_{name}")
        try:
            return await run(args)
        except QueryFailed as exc:
            return ToolResult.failed(
                f"query {exc.query_id} failed: {exc.reason}: {exc.detail}",
                query_id=exc.query_id,
                reason=exc.reason,
                detail=exc.detail,
            )
        except BusError as exc:
            return ToolResult.failed(f"the bus refused it ({exc.code}): {exc}", code=exc.code)
        except PeerClosed:
            return ToolResult.failed(
                "not connected to the bus right now; the bridge reconnects by itself: "
                "try again in a few seconds"
            )
        except PeerError as exc:
            return ToolResult.failed(str(exc))

    # Every peer

    async def _send_message(self, args: SendArgs) -> ToolResult:
        result = await self.peer.send(args.topic, args.type, args.content)
        return ToolResult.of(result.model_dump(by_alias=True))

    async def _fetch_messages(self, args: FetchArgs) -> ToolResult:
        page = await self.peer.fetch(args.topic, args.since_epoch, args.limit)
        messages = [
            {"epoch": message.epoch, **present(message.topic, message.payload)}
            for message in page.messages
        ]
        return ToolResult.of(
            {"messages": messages, "nextEpoch": page.next_epoch, "more": page.more}
        )

    async def _subscribe(self, args: SubscribeArgs) -> ToolResult:
        await self.peer.subscribe(
            args.topic, debounce_ms=args.debounce_ms, min_relevance=args.min_relevance
        )
        return ToolResult.of({"subscribed": args.topic})

    async def _list_subscriptions(self, _args: BaseModel) -> ToolResult:
        subscriptions = await self.peer.list_subscriptions()
        return ToolResult.of(
            {"subscriptions": [s.model_dump(by_alias=True) for s in subscriptions]}
        )

    # A controller

    async def _bcp_channels(self, _args: BaseModel) -> ToolResult:
        return ToolResult.of({"channels": [channel_summary(c) for c in self.channels]})

    async def _bcp_budget(self, _args: BaseModel) -> ToolResult:
        budgets = [
            {
                "reader": channel.reader,
                "budget_bits": channel.budget_bits,
                "delivered_bits": round(self._delivered_bits.get(channel.reader, 0.0), 3),
            }
            for channel in self.channels
        ]
        note = (
            "delivered_bits adds up the answers and pushes this host received since it started; "
            "the gateway also charges 1 bit for each outcome and 3.585 bits for a query that "
            "failed after the reader got it, and refuses a query that does not fit with "
            "budget_exhausted. Its ledger is authoritative (bcpbus audit --bits)."
        )
        return ToolResult.of({"budgets": budgets, "note": note})

    async def _bcp_ask(self, args: AskArgs) -> ToolResult:
        assert self.controller is not None  # call() offers this tool to controllers only
        query_id = f"q-{uuid.uuid4().hex[:12]}"
        spec = args.spec.model_dump(mode="json", exclude_none=True)
        # The whole request through its wire model, so nothing malformed leaves the host.
        BcpQueryRequest.model_validate(
            {
                "query_id": query_id,
                **spec,
                "task_id": args.task_id,
                "escalation_justification": args.escalation_justification,
            }
        )
        try:
            delivery = await self.controller.ask(
                args.reader,
                spec,
                query_id=query_id,
                task_id=args.task_id,
                escalation_justification=args.escalation_justification,
                sealed=args.sealed,
                timeout=args.timeout_s,
            )
        except QueryFailed:
            self._ended.append(query_id)
            raise
        except PeerTimeout:
            return ToolResult.failed(
                f"no answer to query {query_id} within {args.timeout_s} s; it is still open: "
                f"its answer or failure will be in {INBOX} when it comes",
                query_id=query_id,
                reason="waiting",
            )
        self._ended.append(query_id)
        self._count(delivery)
        return delivery_result(delivery)

    async def _bcp_forward(self, args: ForwardArgs) -> ToolResult:
        assert self.controller is not None  # call() offers this tool to controllers only
        result = await self.controller.forward(args.reader, args.to, args.type, args.content)
        data = {"status": "forwarded", "forward_id": result.forward_id, "to": result.to}
        return ToolResult.of(data, f"Forwarded to {result.to}; you did not see the text.")

    async def _pushed(self, content: dict[str, Any]) -> None:
        delivery = BcpResponseDelivery.model_validate(content)
        if self._again(delivery.query_id):
            return
        self._count(delivery)
        self.inbox.add(Message(f"agent:{self.name}", _envelope("bcp_response_delivery", content)))

    async def _failed(self, content: dict[str, Any]) -> None:
        if self._again(str(content.get("query_id"))):
            return
        self.inbox.add(Message(f"agent:{self.name}", _envelope("bcp_query_failed", content)))

    def _again(self, query_id: str | None) -> bool:
        """Whether this query's outcome came before: a query ends once, but a delivery held for
        a controller that was away can come twice, fetched on reconnect and then flushed."""
        if query_id is None:
            return False
        if query_id in self._ended:
            logger.info("%s: dropped a second outcome of query %s", self.peer.client_id, query_id)
            return True
        self._ended.append(query_id)
        return False

    def _count(self, delivery: BcpResponseDelivery) -> None:
        reader = delivery.from_agent
        self._delivered_bits[reader] = self._delivered_bits.get(reader, 0.0) + (
            delivery.bandwidth_bits
        )

    # The inbox

    async def _arrived(self, message: Message) -> Reply:
        self.inbox.add(message)
        return Reply(True, "kept")

    def snapshot(self, limit: int = 100) -> dict[str, Any]:
        """Return what the ``bcpbus://inbox`` resource shows: the newest ``limit`` entries,
        and for a reader the queries waiting and the subscriptions it may publish to."""
        entries = list(self.inbox)[-limit:]
        shown: dict[str, Any] = {
            "client_id": self.peer.client_id,
            "roles": sorted(self.roles),
            "connected": self.peer.connected.is_set(),
            "last_seq": self.inbox.last_seq,
            "messages": [entry.to_json() for entry in entries],
        }
        if self.reader is not None:
            shown["queries_waiting"] = self._queries.qsize()
            shown["subscriptions"] = [
                {
                    "subscription_id": s.get("subscription_id"),
                    "controller": s.get("controller"),
                    "category": s.get("category"),
                }
                for s in self.reader.subscriptions
            ]
        return shown


def _envelope(message_type: str, content: dict[str, Any]) -> dict[str, Any]:
    return {"type": message_type, "from": "system:gateway", "content": content}


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in error['loc']) or 'arguments'}: {error['msg']}"
        for error in exc.errors(include_url=False)
    )
