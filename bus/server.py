"""The bus: authenticates peers, authorizes and routes their messages, over any transport.

:class:`Bus` is the asyncio shell around the pure parts: :mod:`bus.core` decides (joins,
requests, delivery targets), and the shell carries the decisions out with its halves:
:class:`~bus.transports.websocket.WebSocketDoor` (sockets in), :class:`~bus.methods.Methods`
(the method table), :class:`~bus.fanout.Fanout` (messages out) and
:class:`~bus.readback.Readback` (messages read back), recording in :mod:`bus.log.activity`.
Use it as an async context manager::

    async with ActivityLog("bcpbus.db") as log:
        async with Bus(policy=Policy.default(), credentials=creds, log=log) as bus:
            await bus.start("127.0.0.1", 0)
            print(bus.url)
            await stop.wait()
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import ssl as _ssl
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .carry import Carry
from .core.epochs import Epochs
from .core.errors import (
    BusError,
)
from .core.identities import PeerIdentity
from .core.logevents import LogEvent
from .core.policy import Policy
from .core.presence import BUS_CLIENT_ID, PRESENCE_TOPIC, Presence
from .core.router import Route, Router
from .core.state import PeerStates
from .fanout import Fanout
from .log.activity import ActivityLog
from .log.history import History
from .members import Members
from .methods import Methods
from .ops.config import Limits, LogContent
from .ops.credentials import Credentials
from .ops.refusals import Refusals
from .readback import Readback
from .transports.connection import ByteBudget, Link
from .transports.websocket import WebSocketDoor

if TYPE_CHECKING:
    from .transports.cluster import Forwarder

__all__ = ["BUS_CLIENT_ID", "PRESENCE_TOPIC", "Bus", "PeerIdentity"]

logger = logging.getLogger("bus.server")


class Bus:
    """A running JSON-RPC message bus.

    Args:
        policy: the authorization policy in force on every request.
        credentials: the token hashes peers authenticate against.
        log: the activity log; the caller opens and closes it.
        identities: roles and taint per clientId from agent definitions.
        limits: the configurable limits.
        server_id: the ``serverId`` sent in ``initialize`` results; random by default.
        log_content: what ``send_start`` keeps of each envelope: ``full``, or ``digest`` (its
            ``type`` and the SHA-256 of its canonical JSON).
        door: makes the WebSocket door (:class:`WebSocketDoor`, or a subclass on another
            library such as :class:`bus.transports.picows_door.PicowsDoor`).
    """

    def __init__(
        self,
        *,
        policy: Policy,
        credentials: Credentials,
        log: ActivityLog,
        identities: Mapping[str, PeerIdentity] | None = None,
        limits: Limits | None = None,
        server_id: str | None = None,
        log_content: LogContent = "full",
        door: Callable[[Bus], WebSocketDoor] = WebSocketDoor,
    ) -> None:
        if log_content not in ("full", "digest"):
            raise ValueError(f"log_content must be 'full' or 'digest', not {log_content!r}")
        self.policy, self.credentials, self.log = policy, credentials, log
        self.identities = dict(identities or {})
        self.limits = limits = limits or Limits()
        self.server_id = server_id or f"bus-{secrets.token_hex(4)}"
        self.log_content: LogContent = log_content
        self.refusals = Refusals(log, limits.refusal_log_interval, event=LogEvent.WS_REFUSED)
        """What sockets that never initialized were refused, one ``ws_refused`` row per
        interval: an anonymous client cannot write rows of its own (:mod:`bus.ops.refusals`)."""
        self.http_url: str | None = None
        """``http://HOST:PORT`` of the running HTTP binding (:mod:`bus.transports.http`) when the
        bus was assembled with one (:func:`bus.assemble.running`), else None. The binding
        reaches the bus through :class:`bus.transports.port.BusPort`, never the other way."""
        self.http_mount: Callable[[str, Any], None] | None = None
        """Serves an ASGI app under a path on the HTTP binding's port
        (:meth:`bus.transports.http.HttpBinding.mount`) while there is one, else None: how what
        runs beside the bus (the console) adds its pages."""
        self._closing = False
        self._router: Router[Link] = Router()
        self._states: PeerStates[Link] = PeerStates()
        """Every open link's facts beyond routing (bus.core.state), forgotten in one place."""
        self._budget = ByteBudget(limits.max_inflight_bytes)
        self._presence = Presence()
        self._tasks: list[asyncio.Task[None]] = []
        self.carry = Carry(log, self._presence, self.refusals)
        """Carries out the core's decisions (:class:`bus.carry.Carry`)."""
        self._make_door = door
        self._parts(log_content)

    def _parts(self, log_content: LogContent) -> None:
        """Set up the halves of the shell: messages out, reading back, methods, members, the
        WebSocket door; and the entries of theirs that links call on the bus."""
        log, limits, closing = self.log, self.limits, lambda: self._closing
        self._epochs = Epochs(log.last_epoch)
        self._history = History(log.path)
        self._readback = Readback(
            log,
            self._history,
            self._epochs,
            limits,
            log_content=log_content,
            carry=self.carry,
            closing=closing,
        )
        """Reads messages back for fetchMessages and GET /v1/messages (:mod:`bus.readback`)."""
        fanout = self._fanout = Fanout(
            log,
            limits,
            self._router,
            self._states,
            self._epochs,
            log_content=log_content,
            closing=closing,
        )
        methods = self._methods = Methods(
            self._router,
            self._states,
            limits,
            fanout,
            carry=self.carry,
            fetch=self._readback.fetch,
            closing=closing,
        )
        members = self._members = Members(
            self,
            self._router,
            self._states,
            self._epochs,
            carry=self.carry,
            joined_elsewhere=self._joined_elsewhere,
            handle=methods.handle,
            closing=closing,
        )
        self._door = self._make_door(self)
        """Where sockets and in-process links come in (:mod:`bus.transports.websocket`)."""
        self._entries(fanout, methods, members)

    def _entries(self, fanout: Fanout, methods: Methods, members: Members) -> None:
        """What links call on the bus, each carried out (and documented) by one part."""
        self.fetch = self._readback.fetch
        """``fetchMessages`` for any transport: :meth:`bus.readback.Readback.fetch`."""
        self.publish = fanout.publish
        """Deliver a message of the bus's own or a peer's: :meth:`bus.fanout.Fanout.publish`."""
        self.deliver_forwarded = fanout.deliver_forwarded
        """Deliver another node's message here: :meth:`bus.fanout.Fanout.deliver_forwarded`."""
        self.handle = methods.handle
        """A request from a peer not on a socket: :meth:`bus.methods.Methods.handle`."""
        self.record_error = methods.record_error
        """An error answer's row: :meth:`bus.methods.Methods.record_error`."""
        self.local_peers = methods.local_peers
        """This node's ``listPeers``: :meth:`bus.methods.Methods.local_peers`."""
        self.join, self.leave, self.detach = members.join, members.leave, members.leave
        """A socket's ``initialize``, a link gone: :class:`bus.members.Members`."""
        self.route_for_token = members.route_for_token
        """An HTTP request's route: :meth:`bus.members.Members.route_for_token`."""
        self.attach = members.attach
        """A webhook peer joined: :meth:`bus.members.Members.attach`."""
        self.replaced_elsewhere = members.replaced_elsewhere
        """A login on another node: :meth:`bus.members.Members.replaced_elsewhere`."""
        self.route_of = self._router.route
        """A link's route once its peer joined, else None."""
        self.method = methods.method
        """The method of initialized peers of a name: :meth:`bus.methods.Methods.method`."""
        self.quick_method = methods.quick_method
        """Its body if it never waits: :meth:`bus.methods.Methods.quick_method`."""
        self.connect_local = self._door.connect_local
        """An in-process link: :meth:`bus.transports.websocket.WebSocketDoor.connect_local`."""

    # Lifecycle

    async def start(
        self, host: str = "127.0.0.1", port: int = 0, *, ssl: _ssl.SSLContext | None = None
    ) -> None:
        """Listen on ``host:port`` (0 picks a free port; read it back from :attr:`port`); with
        ``ssl``, serve ``wss://``."""
        await self._door.start(host, port, ssl=ssl)
        self.log.record(
            LogEvent.BUS_START,
            actor=BUS_CLIENT_ID,
            payload={"server_id": self.server_id, "url": self.url, "log_content": self.log_content},
        )
        own = functools.partial(self.publish, sender=None)  # the bus's own messages
        self._tasks.append(asyncio.create_task(self._presence.run(own)))
        self._tasks.append(asyncio.create_task(self.refusals.run()))
        logger.info("listening on %s", self.url)

    async def close(self) -> None:
        """Stop accepting, answer the requests in flight, close every connection (1001), wait
        for their handlers. Idempotent.

        The activity log stays open: its owner closes it, which flushes it.
        """
        if self._closing:
            return
        self._closing = True
        door = self._door
        # Stop accepting, but keep reading: requests in flight need their deliveries'
        # answers, and every one of them gets its answer (its result, or -32007 for what
        # arrives from now on) before the connections close.
        door.stop_accepting()
        await door.wait_requests_answered(self.limits.shutdown_grace)
        await door.close()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for timer in self._states.close_all():
            timer.cancel()
        await self._history.close()
        with contextlib.suppress(BusError):  # a log that failed or closed first
            self.refusals.flush()
            self.log.record(LogEvent.SHUTDOWN, actor=BUS_CLIENT_ID)
            await self.log.commit()  # the disconnect and shutdown rows, before close() returns
        logger.info("closed")

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # What it is

    @property
    def peers(self) -> Mapping[str, Link]:
        """The authenticated connections by clientId (a read-only snapshot)."""
        return self._router.peers

    @property
    def methods(self) -> list[str]:
        """The JSON-RPC methods peers may call, ``initialize`` first."""
        return ["initialize", *self._methods]

    @property
    def byte_budget(self) -> ByteBudget:
        """The bytes of requests being handled, for the whole bus (``max_inflight_bytes``);
        a transport charges each request body to it while the request is handled."""
        return self._budget

    def routes(self) -> Iterable[Route[Link]]:
        """Every authenticated peer's route: its link, clientId, grants and patterns."""
        return self._router.routes()

    @property
    def port(self) -> int:
        """The port the bus listens on."""
        return self._door.address[1]

    @property
    def host(self) -> str:
        """The address the bus listens on."""
        return self._door.address[0]

    @property
    def url(self) -> str:
        """``ws://host:port`` of the listening socket (``wss://`` with TLS)."""
        return self._door.url

    @property
    def epochs(self) -> Epochs:
        """The bus's epochs; a cluster link makes them follow the cluster's stream."""
        return self._epochs

    @property
    def latest_epoch(self) -> int:
        """The epoch of the last message accepted (0 before the first one this log holds)."""
        return self._epochs.last

    @property
    def cluster(self) -> Forwarder | None:
        """The other bus nodes (:mod:`bus.transports.cluster`) when this bus is one node of a
        cluster, else None: accepted messages are forwarded there and their answers counted.
        The cluster link sets it while it runs."""
        return self._fanout.cluster

    @cluster.setter
    def cluster(self, forwarder: Forwarder | None) -> None:
        self._fanout.cluster = forwarder

    @property
    def on_delivered(self) -> Callable[[str, float], None] | None:
        """Told each delivery's outcome (``process_finish`` status) and how many seconds the
        ``processMessage`` call took; :mod:`bus.ops.metrics` sets it."""
        return self._fanout.deliveries.on_delivered

    @on_delivered.setter
    def on_delivered(self, hook: Callable[[str, float], None] | None) -> None:
        self._fanout.deliveries.on_delivered = hook

    # What its links call (bus.transports.websocket.SocketBus and bus.transports.port.BusPort)

    @property
    def closing(self) -> bool:
        """Whether :meth:`close` has begun: every new request is refused -32007."""
        return self._closing

    @property
    def states(self) -> PeerStates[Link]:
        """Every open link's facts beyond routing (:mod:`bus.core.state`)."""
        return self._states

    def _joined_elsewhere(self, client_id: str) -> None:
        if self.cluster is not None:  # an older link of this clientId on another node closes
            self.cluster.joined(client_id)

    # Reloading

    def reconfigure(
        self,
        *,
        credentials: Credentials,
        policy: Policy,
        identities: Mapping[str, PeerIdentity],
    ) -> tuple[int, int]:
        """Put a new configuration in force at once, for new and connected peers alike.

        Each connected peer is reviewed as if it initialized again with the token it used
        (:func:`bus.ops.rights.review`): one whose token was removed or rotated, or whose roles the
        policy now refuses, is closed with 4005 (``CLOSE_REVOKED``); the others get their new
        grants and lose the subscriptions those no longer allow. Nothing here awaits, so no
        request is handled under half of the change.

        Returns:
            How many peers were closed, and how many subscriptions were dropped.
        """
        self.credentials, self.policy, self.identities = credentials, policy, dict(identities)
        return self._members.review()
