"""Helpers for testing peers against a real bus: a bus on a free port, credentials, peers.

::

    async with running_bus(tmp_path) as harness:
        async with harness.peer("agent:main") as main, harness.peer("agent:researcher") as r:
            ...
        rows = harness.rows(event="send_finish")

Everything is real: a websockets server on 127.0.0.1 port 0, a SQLite activity log in the
directory you give, the packaged default policy unless you pass one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bus.assemble import running
from bus.core.identities import PeerIdentity, default_agents_dir, load_identities
from bus.core.policy import Policy
from bus.log.activity import ActivityLog
from bus.ops.config import HttpSettings, Limits, LogContent, Transport
from bus.ops.credentials import Credentials
from bus.server import Bus
from schemas.common import GATEWAY_CLIENT_ID, agent_id

from .bcp import Controller, Reader
from .client import Message, Peer, Reply
from .gateway.gateway import Gateway
from .gateway.runner import running_gateway
from .gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from bus.transports.http import HttpBinding

__all__ = [
    "BcpHarness",
    "BusHarness",
    "Events",
    "Inbox",
    "running_bcp",
    "running_bus",
    "scaled",
    "test_transport",
]


def test_transport() -> Transport:
    """What serves the WebSocket peers of :func:`running_bus` when the test does not say:
    ``BCPBUS_TEST_TRANSPORT`` (``websockets`` or ``picows``), else ``websockets``."""
    name = os.environ.get("BCPBUS_TEST_TRANSPORT", "websockets")
    if name not in ("websockets", "picows"):
        raise ValueError(f"BCPBUS_TEST_TRANSPORT must be websockets or picows, not {name!r}")
    return "picows" if name == "picows" else "websockets"


def scaled(seconds: float) -> float:
    """Scale a test timeout by ``BCPBUS_TEST_TIMEOUT_SCALE`` (default 1) for slow machines."""
    return seconds * float(os.environ.get("BCPBUS_TEST_TIMEOUT_SCALE", "1"))


@dataclass
class Inbox:
    """Collects deliveries; ``await inbox.get()`` waits for the next one with a timeout."""

    reply: Reply | bool | None = None
    messages: list[Message] = field(default_factory=list)
    _queue: asyncio.Queue[Message] = field(default_factory=asyncio.Queue)

    async def __call__(self, message: Message) -> Reply | bool | None:
        self.messages.append(message)
        self._queue.put_nowait(message)
        return self.reply

    async def get(self, seconds: float = 5.0) -> Message:
        """Return the next delivery, or raise TimeoutError after ``seconds`` (scaled)."""
        async with asyncio.timeout(scaled(seconds)):
            return await self._queue.get()

    async def get_type(self, message_type: str, seconds: float = 5.0) -> Message:
        """Return the next delivery of ``message_type``, skipping others."""
        async with asyncio.timeout(scaled(seconds)):
            while True:
                message = await self._queue.get()
                if message.type == message_type:
                    return message

    def empty(self) -> bool:
        return self._queue.empty()


@dataclass
class Events:
    """Collects the events a peer reports through an ``out`` callback (:class:`peers.chat.Chat`,
    :class:`peers.system.SystemPeer`); ``await events.wait_for(...)`` waits for one."""

    seen: list[dict[str, Any]] = field(default_factory=list)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, event: dict[str, Any]) -> None:
        self.seen.append(event)
        self._arrived.set()

    async def wait_for(self, kind: str, seconds: float = 10.0, **fields: Any) -> dict[str, Any]:
        """Return the first event so far of ``kind`` whose ``fields`` have the values given;
        wait for it if there is none yet, or raise TimeoutError after ``seconds`` (scaled)."""
        async with asyncio.timeout(scaled(seconds)):
            while True:
                self._arrived.clear()
                for event in self.seen:
                    if event["event"] == kind and all(event.get(k) == v for k, v in fields.items()):
                        return event
                await self._arrived.wait()

    def kinds(self) -> list[str]:
        """The ``event`` of each event so far, in order."""
        return [event["event"] for event in self.seen]

    def of(self, kind: str) -> list[dict[str, Any]]:
        """The events so far of ``kind``."""
        return [event for event in self.seen if event["event"] == kind]


@dataclass
class BusHarness:
    """A running bus with helpers to make credentials and peers for it."""

    bus: Bus
    log: ActivityLog
    credentials: Credentials
    db: Path
    http: HttpBinding | None = None
    """The HTTP binding, when ``running_bus(..., http=...)`` served one."""

    @property
    def url(self) -> str:
        return self.bus.url

    def token(self, client_id: str, roles: Sequence[str] = ()) -> str:
        """Create (or rotate) a credential for ``client_id`` and return its token."""
        return self.credentials.add_ephemeral(client_id, list(roles))

    @property
    def http_url(self) -> str:
        """``http://host:port`` of the HTTP binding (``running_bus(..., http=...)``)."""
        if self.http is None:
            raise RuntimeError("this bus has no HTTP binding: pass http=HttpSettings(port=0)")
        return self.http.url

    async def webhook_peer(
        self,
        client_id: str,
        url: str,
        roles: Sequence[str] = (),
        subscriptions: Sequence[str] = (),
    ) -> tuple[str, str]:
        """Create a webhook peer that the bus reaches at ``url`` and put it online now; return
        its token and its webhook secret."""
        if self.http is None:
            raise RuntimeError("this bus has no HTTP binding: pass http=HttpSettings(port=0)")
        token = self.token(client_id, roles)
        secret = self.credentials.set_webhook(client_id, url, subscriptions)
        record = self.credentials.identify(token)
        assert record is not None
        await self.http.webhooks.attach(record)
        return token, secret

    def peer(self, client_id: str, roles: Sequence[str] = (), **kwargs: Any) -> Peer:
        """A :class:`Peer` with a fresh credential; use it with ``async with``."""
        return Peer(self.url, client_id, self.token(client_id, roles), **kwargs)

    async def refused(self) -> dict[str, int]:
        """Write the WebSocket refusals counted so far as their ``ws_refused`` row (the bus
        writes one per interval) and return the reasons summed over every such row."""
        self.bus.refusals.flush()
        await self.log.commit()
        reasons: dict[str, int] = {}
        for row in self.rows(event="ws_refused"):
            for reason, count in json.loads(row["payload_json"])["reasons"].items():
                reasons[reason] = reasons.get(reason, 0) + count
        return reasons

    def rows(self, **where: Any) -> list[dict[str, Any]]:
        """Committed activity-log rows whose columns equal ``where``, in order."""
        query = "SELECT * FROM activity_log"
        if where:
            query += " WHERE " + " AND ".join(f"{column} = ?" for column in where)
        with contextlib.closing(sqlite3.connect(self.db)) as db:
            db.row_factory = sqlite3.Row
            return [dict(row) for row in db.execute(query + " ORDER BY id", tuple(where.values()))]


@contextlib.asynccontextmanager
async def running_bus(
    directory: str | os.PathLike[str],
    *,
    policy: Policy | None = None,
    identities: Mapping[str, PeerIdentity] | None = None,
    limits: Limits | None = None,
    log_content: LogContent = "full",
    http: HttpSettings | None = None,
    transport: Transport | None = None,
) -> AsyncIterator[BusHarness]:
    """Start a bus on 127.0.0.1 port 0 with its log in ``directory``; close both on exit.

    ``http=HttpSettings(port=0)`` serves the HTTP binding too (:attr:`BusHarness.http_url`).
    ``transport`` serves its WebSocket peers (``websockets`` or ``picows``); by default
    ``BCPBUS_TEST_TRANSPORT``, else ``websockets``, so a suite can run on either.
    """
    db = Path(directory) / "activity.db"
    credentials = Credentials.empty()
    async with running(
        db,
        credentials=credentials,
        policy=policy,
        identities=identities,
        limits=limits,
        log_content=log_content,
        transport=transport or test_transport(),
    ) as bus:
        if http is None or http.port is None:
            yield BusHarness(bus, bus.log, credentials, db)
            return
        from bus.transports.http import HttpBinding  # the http extra: imported only when asked for

        async with HttpBinding(bus, http, host="127.0.0.1") as binding:
            bus.http_url, bus.http_mount = binding.url, binding.mount
            yield BusHarness(bus, bus.log, credentials, db, binding)


@dataclass
class BcpHarness:
    """A running bus with the BCP gateway, and helpers for controllers, readers, approvers."""

    bus: BusHarness
    gateway: Gateway

    def controller(self, name: str) -> Controller:
        """A :class:`Controller` for ``agent:<name>``; call ``await c.start()``."""
        return Controller(self.bus.peer(agent_id(name)))

    def reader(self, name: str) -> Reader:
        """A :class:`Reader` for ``agent:<name>``; call ``await r.start()``."""
        return Reader(self.bus.peer(agent_id(name)))


@contextlib.asynccontextmanager
async def running_bcp(
    directory: str | os.PathLike[str],
    *,
    agents_dir: str | os.PathLike[str] | None = None,
    settings: GatewaySettings | None = None,
    limits: Limits | None = None,
    local: bool = True,
    log_content: LogContent = "full",
    http: HttpSettings | None = None,
) -> AsyncIterator[BcpHarness]:
    """Start a bus and a gateway for the agents in ``agents_dir`` (default: the reference pair).

    ``log_content`` is what the bus's and the gateway's rows keep of content (``full`` or
    ``digest``).

    The gateway connects as ``bcpbus serve`` connects it, over an in-process link
    (:mod:`bus.transports.local`); ``local=False`` connects it over a WebSocket, as ``bcpbus
    gateway``.
    """
    agents = Path(agents_dir) if agents_dir is not None else default_agents_dir()
    if agents is None:
        raise FileNotFoundError("no agents directory")
    async with running_bus(
        directory,
        identities=load_identities(agents),
        limits=limits,
        log_content=log_content,
        http=http,
    ) as h:
        token = h.token(GATEWAY_CLIENT_ID)
        connector = h.bus.connect_local if local else None
        async with running_gateway(
            h.url, token, h.log, agents, settings, connector=connector, log_content=log_content
        ) as gateway:
            yield BcpHarness(h, gateway)
