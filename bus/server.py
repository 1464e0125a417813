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
import logging
import secrets
import ssl as _ssl
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from schemas.bus import ListPeersResult

from .core.actions import Action, Announce, Close, Commit, CountRefusal, Fail, Record, Reply
from .core.delivery import Message
from .core.epochs import Epochs
from .core.errors import (
    BusError,
    ShuttingDown,
)
from .core.identities import PeerIdentity
from .core.logevents import LogEvent
from .core.policy import Grants, Policy
from .core.presence import BUS_CLIENT_ID, PRESENCE_TOPIC, Presence
from .core.protocol import Request
from .core.router import Route, Router
from .core.state import PeerStates
from .fanout import Fanout, record_row
from .log.activity import ActivityLog
from .log.fetch import FetchFilter, FetchResult
from .log.history import History
from .members import Members
from .methods import Accepted, Methods
from .ops.config import Limits, LogContent
from .ops.credentials import Credentials
from .ops.refusals import Refusals
from .readback import Readback
from .transports.connection import ByteBudget, Link
from .transports.local import LocalSocket
from .transports.websocket import Method, WebSocketDoor

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
        self._parts(log_content)

    def _parts(self, log_content: LogContent) -> None:
        """Set up the halves of the shell: sockets in, methods, messages out, reading back."""
        log, limits = self.log, self.limits
        self._epochs = Epochs(log.last_epoch)
        self._history = History(log.path)
        self._readback = Readback(
            log, self._history, self._epochs, limits, log_content=log_content, carry=self.carry
        )
        """Reads messages back for fetchMessages and GET /v1/messages (:mod:`bus.readback`)."""
        self._fanout = Fanout(
            log,
            limits,
            self._router,
            self._states,
            self._epochs,
            log_content=log_content,
            closing=lambda: self._closing,
        )
        """Carries messages out to their targets (:mod:`bus.fanout`)."""
        self._methods = Methods(
            self._router,
            self._states,
            limits,
            self._fanout,
            carry=self.carry,
            fetch=self.fetch,
            closing=lambda: self._closing,
        )
        """The methods of initialized peers (:mod:`bus.methods`)."""
        self._members = Members(
            self,
            self._router,
            self._states,
            self._epochs,
            carry=self.carry,
            joined_elsewhere=self._joined_elsewhere,
        )
        """Joins and leaves over every link, and reloads (:mod:`bus.members`)."""
        self._door = WebSocketDoor(self)
        """Where sockets and in-process links come in (:mod:`bus.transports.websocket`)."""

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
        self._tasks.append(asyncio.create_task(self._presence.run(self._publish_own)))
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
        return self._fanout.on_delivered

    @on_delivered.setter
    def on_delivered(self, hook: Callable[[str, float], None] | None) -> None:
        self._fanout.on_delivered = hook

    # What its links call (bus.transports.websocket.SocketBus and bus.transports.port.BusPort)

    @property
    def closing(self) -> bool:
        """Whether :meth:`close` has begun: every new request is refused -32007."""
        return self._closing

    @property
    def states(self) -> PeerStates[Link]:
        """Every open link's facts beyond routing (:mod:`bus.core.state`)."""
        return self._states

    def route_of(self, link: Link) -> Route[Link] | None:
        """``link``'s route once its peer joined, else None."""
        return self._router.route(link)

    def method(self, name: str) -> Method:
        """The method of initialized peers called ``name``; raises MethodNotFound."""
        return self._methods.method(name)

    async def connect_local(self) -> LocalSocket:
        """Open an in-process link to this bus and return the peer's end.

        Pass this method as ``Peer(..., connector=bus.connect_local)``: the peer then
        initializes, is authorized and logged as over a WebSocket, without a socket (see
        :mod:`bus.transports.local`). The bus closes the link with 1001 when it shuts down.

        Raises:
            ShuttingDown: the bus is closing.
        """
        if self._closing:
            raise ShuttingDown()
        return self._door.open_local()

    async def join(
        self, link: Link, request: Request, *, address: str, remote: str, bearer: str | None
    ) -> tuple[str, Any]:
        """Carry out ``initialize`` for a link that came in on its own (a socket); return the
        clientId and the result (:meth:`bus.members.Members.join`)."""
        return await self._members.join(
            link, request, address=address, remote=remote, bearer=bearer
        )

    def leave(self, link: Link, reason: str) -> None:
        """Forget ``link``: its timers, route and subscriptions; a joined peer's
        ``disconnect`` row and presence (``reason`` is the close code)."""
        self._members.leave(link, reason)

    def _joined_elsewhere(self, client_id: str) -> None:
        if self.cluster is not None:  # an older link of this clientId on another node closes
            self.cluster.joined(client_id)

    def carry(self, actions: list[Action]) -> Any:
        """Carry out a decision's actions (:mod:`bus.core.actions`) in order; return the
        reply's wire form, raise its error, or return None if it has neither."""
        for action in actions:
            match action:
                case Record():
                    record_row(self.log, action)
                case Announce(kind=kind, content=content):
                    self._presence.announce(kind, content)
                case Close(link=link, code=code, reason=reason, after_answer=True):
                    link.close_after_answer(code, reason)
                case Close(link=link, code=code, reason=reason, force=True):
                    link.spawn(link.force_close(code, reason))
                case Close(link=link, code=code, reason=reason):
                    link.spawn(link.close(code, reason))
                case CountRefusal(reason=reason, address=address):
                    self.refusals.count(reason, address)
                case Reply(result=result):
                    return result.model_dump(by_alias=True)
                case Fail(error=error):
                    raise error
                case Commit():  # pragma: no cover - no request decision commits yet
                    raise AssertionError("commit inside a request decision")
        return None

    async def record_error(self, actor: str, request: Request, exc: BusError) -> None:
        """Log the ``rpc_error`` row of an error answer and commit it, before the peer reads
        the answer. :meth:`handle` does it for what it answers; a transport calls it for the
        errors it answers on its own (a malformed HTTP body)."""
        await self._methods.record_error(actor, request, exc)

    # Peers that are not on a socket (bus.transports.http, bus.transports.webhooks)

    async def route_for_token(
        self, token: str | None, request: Request, *, address: str
    ) -> Route[Link]:
        """The route a request that arrived without a socket (HTTP) acts through.

        The peer is the one ``token`` belongs to (the same credentials as ``initialize``). If it
        is online (a socket or a webhook) its route is returned, so it never gets its own
        messages; otherwise a route of its own kind that nothing is delivered to, with the
        grants the policy gives it now. Pass the route to :meth:`handle`.

        Raises:
            AuthenticationFailed: no peer has this token, or the policy refuses its roles; the
                row is logged (``actor`` is ``address``) and committed first.
            ShuttingDown: the bus is closing.
        """
        if self._closing:
            raise ShuttingDown()
        return await self._members.route_for_token(token, request, address=address)

    async def handle(
        self, route: Route[Link], request: Request, *, accepted: Accepted | None = None
    ) -> Any:
        """Carry out ``request`` for ``route``'s peer as if it came on its socket: the same
        checks, limits and rows; an error answer gets its ``rpc_error`` row.

        Args:
            accepted: for ``sendMessage``, called with ``{messageId, epoch}`` once the message
                is accepted (authorized, its rows committed) and before it is delivered, so a
                caller can answer at once and let delivery go on.

        Raises:
            BusError: the JSON-RPC error to answer with.
        """
        return await self._methods.handle(route, request, accepted=accepted)

    async def attach(
        self, link: Link, client_id: str, roles: Iterable[str], patterns: Iterable[str] = ()
    ) -> Route[Link]:
        """Join a peer the bus reaches through ``link`` rather than a socket (a webhook).

        It is authorized, subscribed to its own clientId and to ``patterns``, logged and
        announced as a WebSocket peer's ``initialize`` is; a pattern the policy refuses is
        left out, with its rows. Call :meth:`detach` when it leaves.

        Raises:
            AuthenticationFailed: the policy refuses its roles; the row says why.
        """
        return await self._members.attach(link, client_id, roles, patterns, subscribe=self.handle)

    def detach(self, link: Link, reason: str = "detached") -> None:
        """Forget a peer :meth:`attach` joined; logged and announced as a disconnect."""
        self.leave(link, reason)

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
        return self._members.reconfigure()

    # Publishing, on this node and for the other nodes of a cluster

    async def publish(
        self,
        topic: str,
        payload: dict[str, Any],
        message_id: str,
        message_type: str,
        *,
        sender: Route[Link] | None,
        rpc_id: str | None = None,
        trace_id: str | None = None,
    ) -> int:
        """Deliver ``payload`` to every subscriber of ``topic`` but the sender; return how many
        answered ``processed: true`` (see :meth:`bus.fanout.Fanout.publish`).

        Raises:
            AuditUnavailable: the activity log could not commit; if it failed on the first
                commit, nothing was delivered.
        """
        return await self._fanout.publish(
            topic,
            payload,
            message_id,
            message_type,
            sender=sender,
            rpc_id=rpc_id,
            trace_id=trace_id,
        )

    async def _publish_own(
        self, topic: str, payload: dict[str, Any], message_id: str, message_type: str
    ) -> int:
        return await self.publish(topic, payload, message_id, message_type, sender=None)

    async def deliver_forwarded(
        self,
        topic: str,
        payload: dict[str, Any],
        message_id: str,
        message_type: str,
        *,
        sender: Route[Link] | None,
        epoch: int,
        trace_id: str | None = None,
    ) -> tuple[int, int]:
        """Deliver a message another node accepted (at ``epoch``) to this node's subscribers;
        return how many processed it, of how many were tried (see
        :meth:`bus.fanout.Fanout.deliver_forwarded`). :mod:`bus.transports.cluster` calls
        this."""
        message = Message(topic, payload, message_id, message_type, trace_id=trace_id)
        return await self._fanout.deliver_forwarded(message, sender=sender, epoch=epoch)

    def replaced_elsewhere(self, client_id: str, node: str) -> bool:
        """Close (4001) ``client_id``'s link here: it connected again on ``node``. Nothing is
        announced: the newer connection's node announces it. Return whether it was here."""
        return self._members.replaced_elsewhere(client_id, node)

    def local_peers(self) -> ListPeersResult:
        """The ``listPeers`` result of this node alone (the cluster link asks for it)."""
        return self._methods.local_peers()

    # Reading back

    async def fetch(
        self,
        grants: Grants,
        pattern: str,
        since_epoch: int,
        limit: int | None = None,
        *,
        only: FetchFilter | None = None,
        rpc_id: str | None = None,
    ) -> FetchResult:
        """The messages after ``since_epoch`` on topics matching ``pattern`` that the peer with
        ``grants`` may receive now, oldest first: ``fetchMessages``, for any transport (see
        :meth:`bus.readback.Readback.fetch` for the arguments and errors).

        Raises:
            ShuttingDown: the bus is closing.
        """
        if self._closing:
            raise ShuttingDown()
        return await self._readback.fetch(
            grants, pattern, since_epoch, limit, only=only, rpc_id=rpc_id
        )
