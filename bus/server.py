"""The bus: a websockets server that authenticates peers, authorizes and routes their messages.

:class:`Bus` is the asyncio shell around the pure parts: :mod:`bus.core.protocol` parses frames,
:mod:`bus.core.topics` finds subscribers, :mod:`bus.core.policy` decides, :mod:`bus.log.activity`
records. Use it as an async context manager::

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
from collections.abc import Callable, Coroutine, Iterable, Mapping
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request as HTTPRequest, Response as HTTPResponse

from schemas.bus import (
    FetchMessagesParams,
    InitializeParams,
    ListPeersResult,
)
from schemas.common import timestamp

from . import __version__
from .core import joins, requests, strangers
from .core.actions import Action, Announce, Close, Commit, CountRefusal, Fail, Record, Reply
from .core.delivery import Message
from .core.epochs import Epochs
from .core.errors import (
    CLOSE_GOING_AWAY,
    CLOSE_INITIALIZE_TIMEOUT,
    AlreadyInitialized,
    AuthenticationFailed,
    BusError,
    MethodNotFound,
    NotInitialized,
    ShuttingDown,
)
from .core.identities import PeerIdentity
from .core.logevents import LogEvent
from .core.params import parse
from .core.policy import Grants, Policy
from .core.presence import BUS_CLIENT_ID, PRESENCE_TOPIC, Presence
from .core.protocol import Request
from .core.recent import RecentIds
from .core.router import Route, Router
from .core.state import PeerStates
from .core.watch import Anonymous, SlowConsumers, disconnect_slow
from .fanout import Fanout, record_row
from .log.activity import ActivityLog
from .log.fetch import FetchFilter, FetchResult
from .log.history import History
from .ops.config import Limits, LogContent
from .ops.credentials import Credentials
from .ops.refusals import Refusals
from .ops.rights import Regrant, Revoke, review
from .readback import Readback
from .transports.connection import ByteBudget, Connection, Link, PeerGone
from .transports.local import LocalSocket, Socket, local_pair

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
        self.policy = policy
        self.credentials = credentials
        self.log = log
        self.identities = dict(identities or {})
        self.limits = limits or Limits()
        self.server_id = server_id or f"bus-{secrets.token_hex(4)}"
        if log_content not in ("full", "digest"):
            raise ValueError(f"log_content must be 'full' or 'digest', not {log_content!r}")
        self.log_content: LogContent = log_content
        self._connections: set[Connection] = set()
        self._watch(self.limits)
        self._refusals_task: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._local_links: set[asyncio.Task[None]] = set()
        self._router: Router[Link] = Router()
        self._server: Server | None = None
        self._scheme = "ws"
        self._closing = False
        self._presence = Presence()
        self._presence_task: asyncio.Task[None] | None = None
        self._epochs = Epochs(log.last_epoch)
        self._states: PeerStates[Link] = PeerStates()
        """Every open link's facts beyond routing (bus.core.state), forgotten in one place."""
        self.http_url: str | None = None
        """``http://HOST:PORT`` of the running HTTP binding (:mod:`bus.transports.http`) when the
        bus was assembled with one (:func:`bus.assemble.running`), else None. The binding
        reaches the bus through :class:`bus.transports.port.BusPort`, never the other way."""
        self.http_mount: Callable[[str, Any], None] | None = None
        """Serves an ASGI app under a path on the HTTP binding's port
        (:meth:`bus.transports.http.HttpBinding.mount`) while there is one, else None: how what
        runs beside the bus (the console) adds its pages."""
        self._parts(log_content)
        self._methods: dict[str, Callable[[Route[Link], Request], Coroutine[Any, Any, Any]]] = {
            "subscribe": self._subscribe,
            "unsubscribe": self._unsubscribe,
            "sendMessage": self._send_message,
            "fetchMessages": self._fetch_messages,
            "listSubscriptions": self._list_subscriptions,
            "ping": self._ping,
            "listPeers": self._list_peers,
        }

    def _parts(self, log_content: LogContent) -> None:
        """Set up the halves of the shell that read the log back and carry messages out."""
        log = self.log
        self._history = History(log.path)
        self._readback = Readback(
            log,
            self._history,
            self._epochs,
            self.limits,
            log_content=log_content,
            carry=self._carry,
        )
        """Reads messages back for fetchMessages and GET /v1/messages (:mod:`bus.readback`)."""
        self._fanout = Fanout(
            log,
            self.limits,
            self._router,
            self._states,
            self._epochs,
            log_content=log_content,
            closing=lambda: self._closing,
        )
        """Carries messages out to their targets (:mod:`bus.fanout`)."""

    def _watch(self, limits: Limits) -> None:
        """Set up what the bus counts and bounds: anonymous sockets and their refusals, bytes
        in flight, recent messageIds, slow consumers."""
        self._anonymous = Anonymous(
            total=limits.max_anonymous_connections, per_address=limits.max_anonymous_per_address
        )
        self.refusals = Refusals(self.log, limits.refusal_log_interval, event=LogEvent.WS_REFUSED)
        """What sockets that never initialized were refused, one ``ws_refused`` row per
        interval: an anonymous client cannot write rows of its own (:mod:`bus.ops.refusals`)."""
        self._budget = ByteBudget(limits.max_inflight_bytes)
        window, timeout = limits.dedup_window, limits.slow_consumer_timeout
        self._recent = (
            None if window is None else RecentIds(window=window, max_ids=limits.dedup_max_ids)
        )
        self._slow: SlowConsumers[Connection] | None = (
            None if timeout is None else SlowConsumers(timeout)
        )

    # Lifecycle

    async def start(
        self, host: str = "127.0.0.1", port: int = 0, *, ssl: _ssl.SSLContext | None = None
    ) -> None:
        """Listen on ``host:port`` (0 picks a free port; read it back from :attr:`port`); with
        ``ssl``, serve ``wss://``."""
        limits = self.limits
        self._scheme = "wss" if ssl is not None else "ws"
        self._server = await serve(
            self._handle_connection,
            host,
            port,
            process_request=self._process_request,
            max_size=limits.max_frame_bytes,
            open_timeout=limits.handshake_timeout,
            compression=None,
            ssl=ssl,
        )
        self.log.record(
            LogEvent.BUS_START,
            actor=BUS_CLIENT_ID,
            payload={"server_id": self.server_id, "url": self.url, "log_content": self.log_content},
        )
        self._presence_task = asyncio.create_task(self._presence.run(self._publish_own))
        self._refusals_task = asyncio.create_task(self.refusals.run())
        if self._slow is not None:
            self._sweeper = asyncio.create_task(self._sweep_slow_consumers())
        logger.info("listening on %s", self.url)

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
        if self._server is None:
            raise RuntimeError("the bus is not started")
        port: int = next(iter(self._server.sockets)).getsockname()[1]
        return port

    @property
    def host(self) -> str:
        if self._server is None:
            raise RuntimeError("the bus is not started")
        host: str = next(iter(self._server.sockets)).getsockname()[0]
        return host

    @property
    def url(self) -> str:
        """``ws://host:port`` of the listening socket (``wss://`` with TLS)."""
        return f"{self._scheme}://{self.host}:{self.port}"

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

    async def close(self) -> None:
        """Stop accepting, close every connection (1001), wait for their handlers. Idempotent.

        The activity log stays open: its owner closes it, which flushes it.
        """
        if self._closing:
            return
        self._closing = True
        if self._server is not None:
            # Stop accepting, but keep reading: requests in flight need their deliveries'
            # answers, and every one of them gets its answer (its result, or -32007 for what
            # arrives from now on) before the connections close.
            self._server.close(close_connections=False)
        await self._wait_requests_answered()
        for conn in list(self._connections):
            conn.spawn(conn.close(CLOSE_GOING_AWAY, "bus shutting down"))
        if self._server is not None:
            await self._server.wait_closed()
        if self._local_links:
            await asyncio.wait(set(self._local_links))
        for task in (self._presence_task, self._sweeper, self._refusals_task):
            if task is not None:
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

    async def _wait_requests_answered(self) -> None:
        busy = [conn for conn in self._connections if conn.requests_in_flight]
        if not busy:
            return
        grace = self.limits.shutdown_grace
        _, pending = await asyncio.wait(
            [asyncio.ensure_future(conn.wait_requests_answered()) for conn in busy],
            timeout=grace,
        )
        for waiter in pending:
            waiter.cancel()
        if not pending:
            return
        await asyncio.wait(pending)
        logger.warning("closing with requests unanswered after %ss: answering -32007", grace)
        late = ShuttingDown(
            "The bus shut down before this request was answered; it may have been carried out"
        )
        for conn in busy:
            conn.abandon_requests(late)
        await asyncio.wait([asyncio.ensure_future(conn.wait_requests_answered()) for conn in busy])

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # Connections

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
        bus_end, peer_end = local_pair()
        link = asyncio.get_running_loop().create_task(self._handle_connection(bus_end))
        self._local_links.add(link)
        link.add_done_callback(self._local_links.discard)
        return peer_end

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
        record = self.credentials.identify(token)
        if record is None:
            self.log.record(
                LogEvent.AUTH_FAILED,
                rpc_id=_rpc_id(request),
                actor=address,
                status="refused",
                error="unknown token" if token else "no credential",
            )
            with contextlib.suppress(BusError):
                await self.log.commit()
            raise AuthenticationFailed(
                "Authentication failed: send Authorization: Bearer with the token "
                "`bcpbus peers add` printed"
            )
        route = self._router.route_of(record.client_id)
        if route is not None:
            return route
        granted = joins.grant(
            self._rules(), record.client_id, record.roles, rpc_id=_rpc_id(request)
        )
        self._carry(granted.actions)
        assert granted.grants is not None  # else _carry raised its error
        return Route(_Detached(record.client_id), record.client_id, granted.grants)

    async def handle(
        self,
        route: Route[Link],
        request: Request,
        *,
        accepted: Callable[[dict[str, Any]], None] | None = None,
    ) -> Any:
        """Carry out ``request`` for ``route``'s peer as if it came on its socket: the same
        checks, limits and rows; an error answer gets its ``rpc_error`` row.

        Args:
            accepted: for ``sendMessage``, called with ``{messageId}`` once the message is
                accepted (authorized, its rows committed) and before it is delivered, so a
                caller can answer at once and let delivery go on.

        Raises:
            BusError: the JSON-RPC error to answer with.
        """
        try:
            if self._closing:
                raise ShuttingDown()
            if request.method == "sendMessage":
                return await self._send_message(route, request, accepted)
            method = self._methods.get(request.method)
            if method is None:
                raise MethodNotFound(f"Method not found: {request.method[:64]!r}")
            # A peer that is not online may still ask what it missed: that is how it reads.
            offline_ok = request.method in ("ping", "fetchMessages")
            if self._router.route(route.handle) is not route and not offline_ok:
                raise NotInitialized(
                    f"{route.client_id} is not online, so nothing could be delivered to it: "
                    "give it a webhook (bcpbus peers add ID --webhook URL) or connect it over "
                    "WebSocket to subscribe"
                )
            return await method(route, request)
        except BusError as exc:
            await self.record_error(route.client_id, request, exc)
            raise

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
        rules = self._rules()
        self._carry(joins.attach(self._router, link, client_id, roles, rules, name=link.name))
        route = self._router.route(link)
        assert route is not None  # else _carry raised the refusal
        self._states.open(link).joined(timestamp())
        for pattern in patterns:
            request = Request(None, "subscribe", {"topic": pattern})
            try:
                await self.handle(route, request)
            except BusError as exc:
                logger.warning("%s: not subscribed to %r: %s", client_id, pattern, exc)
        return route

    def detach(self, link: Link, reason: str = "detached") -> None:
        """Forget a peer :meth:`attach` joined; logged and announced as a disconnect."""
        for timer in self._states.close(link):
            timer.cancel()
        self._carry(joins.leave(self._router, link, reason))

    def _process_request(self, ws: ServerConnection, request: HTTPRequest) -> HTTPResponse | None:
        if request.path == "/healthz":
            return ws.respond(HTTPStatus.OK, "ok\n")
        if self._closing:
            return ws.respond(HTTPStatus.SERVICE_UNAVAILABLE, "shutting down\n")
        # Sockets that have not authenticated are counted apart from peers, in total and per
        # address, so that anonymous sockets can never take the places of peers. A handshake
        # that carries a peer's token passes: anonymous sockets from its address (a NAT, a
        # shared host) cannot keep it out.
        address = _address(ws)
        refusal = self._anonymous.refusal(address)
        if refusal is not None and self.credentials.identify(_bearer(ws)) is None:
            name, _ = refusal
            self.refusals.count(name, address)
            return ws.respond(
                HTTPStatus.SERVICE_UNAVAILABLE, "too many connections that have not initialized\n"
            )
        return None

    async def _handle_connection(self, ws: ServerConnection | LocalSocket) -> None:
        conn = Connection(
            ws,
            self._handle_request,
            max_inflight=self.limits.max_inflight_deliveries,
            max_requests=self.limits.max_inflight_requests,
            budget=self._budget,
            on_protocol_error=self._protocol_error,
            on_frame_refused=self._frame_refused,
        )
        self._connections.add(conn)
        self._states.open(conn)
        address = _address(ws)
        self._anonymous.opened(address)  # its connect row waits for initialize (anonymous: none)
        watchdog = asyncio.create_task(self._initialize_watchdog(conn))
        try:
            await conn.run()
        except ConnectionClosed as exc:
            if exc.sent is not None and exc.sent.code == 1009:
                limit = f"limit {self.limits.max_frame_bytes}"
                event = LogEvent.FRAME_TOO_LARGE
                self._carry(strangers.frame_refused(event, conn.client_id, address, error=limit))
        finally:
            watchdog.cancel()
            if conn.client_id is None:
                self._anonymous.closed(address)
            self._connections.discard(conn)
            if self._slow is not None:
                self._slow.forget(conn)
            self._forget(conn)
            await conn.drain_tasks()

    async def _initialize_watchdog(self, conn: Connection) -> None:
        timeout = self.limits.initialize_timeout
        if timeout is None:
            return
        try:
            async with asyncio.timeout(timeout):
                await conn.initialized.wait()
        except TimeoutError:
            self.refusals.count("initialize_timeout", _address(conn.ws))
            await conn.close(CLOSE_INITIALIZE_TIMEOUT, "initialize timeout")

    def _forget(self, conn: Connection) -> None:
        for timer in self._states.close(conn):
            timer.cancel()
        self._carry(joins.leave(self._router, conn, str(conn.ws.close_code)))

    # Requests

    async def _handle_request(self, conn: Connection, request: Request) -> Any:
        try:
            # Dispatch inline rather than in a helper coroutine: one frame less per request.
            if self._closing:
                raise ShuttingDown()
            if request.method == "initialize":
                return await self._initialize(conn, request)
            route = self._router.route(conn)
            if route is None:
                raise NotInitialized()
            method = self._methods.get(request.method)
            if method is None:
                raise MethodNotFound(f"Method not found: {request.method[:64]!r}")
            return await method(route, request)
        except BusError as exc:
            if conn.client_id is None and not conn.closing_after_answer:
                self._anonymous_error(conn, closing=False)  # anonymous: counted, no row each
            elif not isinstance(exc, joins.WrongToken):  # counted into ws_refused instead
                await self.record_error(conn.name, request, exc)
            raise

    async def record_error(self, actor: str, request: Request, exc: BusError) -> None:
        """Log the ``rpc_error`` row of an error answer and commit it, before the peer reads
        the answer. :meth:`handle` does it for what it answers; a transport calls it for the
        errors it answers on its own (a malformed HTTP body)."""
        self.log.record(
            LogEvent.RPC_ERROR,
            rpc_id=_rpc_id(request),
            actor=actor,
            status=str(exc.code),
            payload={"method": request.method[:64]},
            error=exc.message,
        )
        with contextlib.suppress(BusError):
            await self.log.commit()

    def _protocol_error(self, conn: Connection, error: BusError) -> None:
        if conn.client_id is None:
            self._anonymous_error(conn, closing=conn.closing_after_answer)
        else:
            self.log.record(
                LogEvent.RPC_ERROR, actor=conn.name, status=str(error.code), error=error.message
            )

    def _frame_refused(self, conn: Connection, reason: str) -> None:
        event = LogEvent.FRAME_REFUSED
        address = _address(conn.ws)
        self._carry(strangers.frame_refused(event, conn.client_id, address, status=reason))

    def _anonymous_error(self, conn: Connection, *, closing: bool) -> None:
        state = self._states.get(conn)
        self._carry(strangers.error_answered(state, conn, _address(conn.ws), closing=closing))

    async def _initialize(self, conn: Connection, request: Request) -> Any:
        if conn.client_id is not None:
            raise AlreadyInitialized()
        params = parse(InitializeParams, request.params)
        client_id = params.client_id
        token = params.auth.token if params.auth is not None else _bearer(conn.ws)
        address, remote = _address(conn.ws), str(conn.ws.remote_address)
        ask = joins.Ask(client_id, _rpc_id(request), address, token is not None, remote)
        record = self.credentials.verify(client_id, token)
        credential = None if record is None else joins.Credential(record.roles, record.token_hash)
        actions = joins.initialize(
            self._router,
            conn,
            credential,
            ask,
            self._rules(),
            attached=lambda link: not isinstance(link, Connection),
            epoch=self._epochs.last,
        )
        result = self._carry(actions)
        self._states.open(conn).joined(timestamp())
        if self.cluster is not None:  # an older link of this clientId on another node closes
            self.cluster.joined(client_id)
        self._anonymous.closed(ask.address)
        conn.authenticated(client_id)
        return result

    def _rules(self) -> joins.Rules:
        """What a join is decided by, as configured now (a reload changes it)."""
        return joins.Rules(
            self.policy, self.identities, self.limits.max_connections, self.server_id, __version__
        )

    async def _subscribe(self, route: Route[Link], request: Request) -> Any:
        limit = self.limits.max_subscriptions
        return self._carry(
            requests.subscribe(
                self._router,
                route,
                request.params,
                rpc_id=_rpc_id(request),
                max_subscriptions=limit,
            )
        )

    async def _list_subscriptions(self, route: Route[Link], request: Request) -> Any:
        return self._carry(requests.list_subscriptions(route))

    async def _unsubscribe(self, route: Route[Link], request: Request) -> Any:
        return self._carry(
            requests.unsubscribe(self._router, route, request.params, rpc_id=_rpc_id(request))
        )

    async def _ping(self, route: Route[Link], request: Request) -> Any:
        return {"pong": True, "serverTime": timestamp()}

    async def _list_peers(self, route: Route[Link], request: Request) -> Any:
        self._carry(requests.admit_admin(route, _rpc_id(request), request.method))
        result = self.local_peers()
        if self.cluster is not None:  # and every other node's
            result = await self.cluster.list_peers(result)
        return result.model_dump(by_alias=True)

    def local_peers(self) -> ListPeersResult:
        """The ``listPeers`` result of this node alone (the cluster link asks for it)."""
        since = {link: state.since for link, state in self._states.items()}
        routes = self._router.routes()
        return requests.peer_list(routes, since, _link_facts, now=timestamp())

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
        revoked = dropped = 0
        for change in review(list(self._router.routes()), credentials, policy, self.identities):
            match change:
                case Revoke(route=route, reason=reason, detail=detail):
                    self._carry(joins.revoke(self._router, route, reason, detail))
                    revoked += 1
                case Regrant(route=route, grants=grants):
                    self._carry(joins.regrant(self._router, route, grants, change.dropped))
                    dropped += len(change.dropped)
        return revoked, dropped

    def _carry(self, actions: list[Action]) -> Any:
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

    # Publishing

    async def _send_message(
        self,
        route: Route[Link],
        request: Request,
        accepted: Callable[[dict[str, Any]], None] | None = None,
    ) -> Any:
        rpc_id = _rpc_id(request)
        recent = self._recent
        admission = requests.admit_send(
            route,
            request.params,
            rpc_id=rpc_id,
            recent=recent,
            now=_clock() if recent is not None else 0.0,
        )
        fields, topic = admission.fields, admission.topic
        if fields is None:
            return self._carry(admission.actions)
        assert isinstance(request.params, dict)  # validated as an object above
        key = (route.client_id, fields.message_id)
        if self.cluster is not None:
            self._check_cluster(key)
        message = Message(
            topic,
            request.params["payload"],
            fields.message_id,
            fields.type,
            trace_id=fields.trace_id,
            relevance=fields.relevance,
        )
        try:
            targets = await self._fanout.accept(message, sender=route, rpc_id=rpc_id)
        except BusError:
            if recent is not None:
                recent.release(key)  # nothing was delivered: a retry may go through
            raise
        if accepted is not None:
            accepted({"messageId": fields.message_id, "epoch": message.epoch})
        delivered = await self._fanout.fan_out(
            targets, message, actor=route.client_id, rpc_id=rpc_id
        )
        return {
            "accepted": True,
            "messageId": fields.message_id,
            "deliveredTo": delivered,
            "epoch": message.epoch,
        }

    def _check_cluster(self, key: tuple[str, str]) -> None:
        """Refuse (-32011) a send while this node is cut off from the other nodes: never
        half-deliver. The messageId is released, so a retry may go through."""
        assert self.cluster is not None
        try:
            self.cluster.check()
        except BusError:
            if self._recent is not None:
                self._recent.release(key)
            raise

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
        actions = joins.replaced_elsewhere(self._router, client_id, node)
        self._carry(actions)
        return bool(actions)

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

    @property
    def on_delivered(self) -> Callable[[str, float], None] | None:
        """Told each delivery's outcome (``process_finish`` status) and how many seconds the
        ``processMessage`` call took; :mod:`bus.ops.metrics` sets it."""
        return self._fanout.on_delivered

    @on_delivered.setter
    def on_delivered(self, hook: Callable[[str, float], None] | None) -> None:
        self._fanout.on_delivered = hook

    async def _publish_own(
        self, topic: str, payload: dict[str, Any], message_id: str, message_type: str
    ) -> int:
        return await self.publish(topic, payload, message_id, message_type, sender=None)

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

    async def _fetch_messages(self, route: Route[Link], request: Request) -> Any:
        params = parse(FetchMessagesParams, request.params)
        result = await self.fetch(
            route.grants,
            params.topic,
            params.since_epoch,
            params.limit,
            rpc_id=_rpc_id(request),
        )
        return result.to_wire()

    # Slow consumers

    async def _sweep_slow_consumers(self) -> None:
        """Disconnect (4004) every peer the bus has not been able to write to for
        ``slow_consumer_timeout`` seconds, as NATS's write deadline does.

        "Not able to write" means the socket's unread bytes stayed above its low water mark
        (:meth:`Connection.write_blocked`) at every check. The WebSocket keepalive cannot catch
        such a peer: its ping waits behind the unread bytes, so its timeout never starts. One
        task checks every socket, which costs well under a microsecond each.
        """
        slow = self._slow
        assert slow is not None
        interval = min(1.0, slow.timeout / 4)
        while True:
            await asyncio.sleep(interval)
            states = [(conn, conn.write_blocked()) for conn in self._connections]
            for conn in slow.check(states, _clock()):
                unread = conn.write_buffer_size()
                self._carry(disconnect_slow(conn, conn.name, unread, slow.timeout))


class _Detached:
    """The link of a peer that sent a request over HTTP and is not online: it only sends, and
    the bus has no way to deliver to it (it is in no routing table)."""

    kind = "http"

    def __init__(self, client_id: str) -> None:
        self.name = client_id
        self.inflight: asyncio.Semaphore | None = None

    def write_buffer_size(self) -> int:
        return 0

    async def call(self, method: str, params: Any) -> Any:
        raise PeerGone(self.name)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(coro)  # pragma: no cover - never joined

    async def close(self, code: int, reason: str) -> None:
        return None


def _bearer(ws: Socket) -> str | None:
    header = ws.request.headers.get("Authorization") if ws.request is not None else None
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    return None


def _address(ws: Socket) -> str:
    """The remote IP address of a socket, the unit of the anonymous-connection limit."""
    remote = ws.remote_address
    return str(remote[0]) if isinstance(remote, tuple) and remote else str(remote)


def _clock() -> float:
    return asyncio.get_running_loop().time()


def _rpc_id(request: Request) -> str | None:
    return None if request.id is None else str(request.id)


def _link_facts(link: Link) -> requests.LinkFacts:
    """A link's address and load for ``listPeers``: a peer the bus reaches another way than a
    connection (a webhook) shows its link's name and nothing in flight."""
    if isinstance(link, Connection):
        return requests.LinkFacts(
            _address(link.ws), link.requests_in_flight, link.deliveries_in_flight
        )
    return requests.LinkFacts(link.name)
