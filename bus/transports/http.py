"""The HTTP binding: the bus over plain HTTP requests, for peers that cannot hold a WebSocket.

It listens on a port of its own (``bcpbus serve --http-port PORT``), served by uvicorn in the
bus's own event loop, beside the WebSocket server, which stays websockets' own: its framing,
handshake and write-buffer limits and its slow-consumer detection are built on it. A request is
not a second implementation of the bus: it is authenticated against the same credentials
(``Authorization: Bearer``), then turned into the JSON-RPC request a WebSocket peer would send
and carried out by :meth:`bus.server.Bus.handle`, so the policy, the envelope checks, the limits
and the log rows are the WebSocket path's own.

The routes are :data:`schemas.http.ROUTES`, written once: publish (``POST /v1/messages``) and
read back (``GET /v1/messages``) as the token's peer, manage its webhook's subscriptions
(``/v1/subscriptions``), discovery (``/.well-known/bcpbus``), ``/metrics``, ``/healthz`` and
``/openapi.json``, the OpenAPI document built from the same table. :meth:`HttpBinding._routes`
gives each its handler by ``operationId``.

Errors answer the JSON-RPC error object (``{"error": {code, message, data}}``) with an HTTP
status that says the same thing (each error class's ``http_status``), and every response carries
``X-Request-Id``, the ``rpc_id`` of the request's rows in the activity log. Webhook peers, whom
the bus reaches over HTTP in the other direction, are :mod:`bus.transports.webhooks`.

Use it beside a started bus::

    async with HttpBinding(bus, HttpSettings(port=0)) as http:
        print(http.url)
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl as _ssl
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict
from typing import Any
from urllib.parse import urlencode

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp

from schemas.common import BUS_CLIENT_ID, timestamp
from schemas.http import (
    ROUTES,
    Discovery,
    Endpoints,
    MessagesQuery,
    PostMessage,
    SubscriptionBody,
    openapi_document,
)

from .. import __version__
from ..core._json import loads
from ..core.errors import (
    AuthenticationFailed,
    BusError,
    InvalidParams,
    InvalidRequest,
    LimitExceeded,
    ParseError,
)
from ..core.logevents import LogEvent
from ..core.params import parse
from ..core.protocol import Request
from ..core.router import Route as BusRoute
from ..log.fetch import FetchFilter, log_time
from ..ops.config import HttpSettings
from ..ops.metrics import CONTENT_TYPE, Metrics
from ..ops.refusals import Refusals
from ..ops.startup import StartupError
from .admission import ConnectionGuard, guarded_protocol
from .connection import charged_context
from .port import BusPort
from .webhooks import Webhooks

__all__ = ["BodyTimeout", "BodyTooLarge", "HttpBinding", "listen"]

logger = logging.getLogger("bus.transports.http")


class BodyTooLarge(InvalidRequest):
    """A request body larger than ``max_frame_bytes``: answered 413."""

    http_status = 413


class BodyTimeout(InvalidRequest):
    """A request body not all sent within ``body_timeout``: answered 408, connection closed."""

    http_status = 408


class HttpBinding:
    """The HTTP side of one bus: its routes, the uvicorn server, webhook peers and metrics.

    Args:
        bus: the started bus.
        settings: port, host, webhook timeouts; ``port`` None is taken as 0.
        host: the interface when ``settings.host`` is None (``bcpbus serve`` passes the
            WebSocket's).
        ssl: serve ``https://`` with this context: the bus's own
            (:func:`bus.ops.tls.server_context`) when it serves ``wss://``.

    Raises:
        StartupError: the bus serves ``wss://`` and ``ssl`` is None: the same tokens would
            cross the HTTP port in plaintext.
    """

    def __init__(
        self,
        bus: BusPort,
        settings: HttpSettings,
        *,
        host: str = "127.0.0.1",
        ssl: _ssl.SSLContext | None = None,
    ) -> None:
        if ssl is None and bus.url.startswith("wss://"):
            raise StartupError(
                "the bus serves wss:// but the HTTP binding was given no TLS context: it will "
                "not serve the same tokens over plain http://"
            )
        self.bus = bus
        self.settings = settings
        self.host = settings.host or host
        self.ssl = ssl
        """The TLS context of ``https://``; None serves plain ``http://``."""
        self.metrics = Metrics(bus)
        self.webhooks = Webhooks(bus, bus.credentials, settings)
        self.refusals = Refusals(bus.log, settings.refusal_log_interval, self.metrics.http_refused)
        """Anonymous refusals, logged as one ``http_refused`` row per interval."""
        self.guard = ConnectionGuard(
            self.refusals,
            per_address=settings.max_anonymous_per_address,
            header_timeout=settings.header_timeout,
        )
        """The header timeout and the per-address cap of anonymous connections."""
        self.app = Starlette(routes=self._routes())
        """The ASGI application; mount it elsewhere if the bus's own server is not wanted."""
        self._listener = _Listener(self.host, ssl)
        self._flusher: asyncio.Task[None] | None = None
        self._posted = _Posted(bus, settings.max_requests)
        self._closing = False

    def _routes(self) -> list[BaseRoute]:
        """The Starlette routes of :data:`schemas.http.ROUTES`, each to its handler by
        ``operationId``; the authenticated ones through :meth:`_guard`."""
        handlers: dict[str, Callable[..., Awaitable[Response]]] = {
            "postMessage": self._post_message,
            "getMessages": self._get_messages,
            "listSubscriptions": self._list,
            "subscribe": self._subscribe,
            "unsubscribe": self._unsubscribe,
            "discover": self._discovery,
            "metrics": self._metrics,
            "health": self._health,
            "openapi": self._openapi,
        }
        return [
            Route(op.path, self._guard(handler) if op.secured else handler, methods=[op.method])
            for op in ROUTES
            for handler in (handlers[op.operation_id],)
        ]

    def mount(self, path: str, app: ASGIApp) -> None:
        """Serve ``app`` under ``path`` on this binding's port, beside its own routes.

        For what runs beside the bus and has pages of its own (the console, :mod:`peers.console`,
        at ``/console``). Call it before or after :meth:`start`.
        """
        self.app.router.routes.append(Mount(path, app=app))

    # Lifecycle

    async def start(self) -> None:
        """Start counting metrics, attach the webhook peers, then listen.

        Raises:
            OSError: the port cannot be listened on.
        """
        self.metrics.attach()
        await self.webhooks.start()
        await self._listener.start(
            _uvicorn(self, self.bus.limits.shutdown_grace), self.settings.port or 0
        )
        self._flusher = asyncio.create_task(self.refusals.run())
        self.bus.log.record(LogEvent.HTTP_START, actor=BUS_CLIENT_ID, payload={"url": self.url})
        logger.info("HTTP on %s", self.url)

    @property
    def port(self) -> int:
        """The port the binding listens on (RuntimeError before :meth:`start`)."""
        return self._listener.port

    @property
    def url(self) -> str:
        """``http://host:port``, or ``https://`` with TLS."""
        return self._listener.url

    async def close(self) -> None:
        """Stop listening, finish the requests in flight (``shutdown_grace``), let the
        deliveries of accepted messages end, detach the webhook peers. Idempotent."""
        if self._closing:
            return
        self._closing = True
        await self._listener.stop()
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
        self.refusals.flush()
        await self._posted.finish(self.bus.limits.shutdown_grace)
        await self.webhooks.close()
        self.metrics.detach()

    async def __aenter__(self) -> HttpBinding:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # Routes

    def _guard(
        self, handler: Callable[[HTTPRequest, Request], Awaitable[Response]]
    ) -> Callable[[HTTPRequest], Awaitable[Response]]:
        """Give ``handler`` a request id, and answer a :class:`BusError` it raises."""

        async def endpoint(request: HTTPRequest) -> Response:
            rpc = Request(f"http-{uuid.uuid4().hex[:16]}", "", None)
            try:
                response = await handler(request, rpc)
            except BusError as exc:
                response = _error(exc)
            response.headers["X-Request-Id"] = str(rpc.id)
            return response

        return endpoint

    async def _post_message(self, request: HTTPRequest, rpc: Request) -> Response:
        rpc = Request(rpc.id, "sendMessage", None)
        route = await self._authenticate(request, rpc)
        size = 0
        try:
            wait = _flag(request.query_params.get("wait"), "wait")
            self._posted.check(route.client_id)
            body, size = await self._body(request, route.client_id)
            if isinstance(body, dict) and "traceparent" in request.headers:
                body = _with_traceparent(body, request.headers["traceparent"])
            message = parse(PostMessage, body)
        except BusError as exc:
            self.bus.byte_budget.give(size)
            await self.bus.record_error(route.client_id, rpc, exc)
            raise
        rpc = Request(rpc.id, "sendMessage", _send_params(message, route.client_id))
        accepted: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

        def on_accept(info: dict[str, Any]) -> None:
            if not accepted.done():
                accepted.set_result(info)

        # The body's bytes stay charged to the bus's budget until the delivery ends, as a
        # WebSocket frame's do until its request is answered.
        task = self._posted.own(
            self.bus.handle(route, rpc, accepted=None if wait else on_accept), size
        )
        if wait:
            # Shielded: a client that goes away does not stop the delivery it asked for.
            return JSONResponse(await asyncio.shield(task))
        await asyncio.wait({task, accepted}, return_when=asyncio.FIRST_COMPLETED)
        if not accepted.done():
            accepted.cancel()
            task.result()  # refused before it was accepted: raises its BusError
        return JSONResponse(accepted.result(), status_code=202)

    async def _get_messages(self, request: HTTPRequest, rpc: Request) -> Response:
        rpc = Request(rpc.id, "fetchMessages", None)
        route = await self._authenticate(request, rpc)
        try:
            query = parse(MessagesQuery, dict(request.query_params))
            only = FetchFilter(
                type=query.type,
                correlation_id=query.correlation_id,
                sender=query.from_,
                before=None if query.until is None else log_time(query.until),
            )
            page = await self.bus.fetch(
                route.grants, query.topic, query.since, query.limit, only=only, rpc_id=str(rpc.id)
            )
        except BusError as exc:
            await self.bus.record_error(route.client_id, rpc, exc)
            raise
        body = page.to_wire()
        body["next"] = _next_page(request, page.next_epoch) if page.more else None
        return JSONResponse(body)

    async def _list(self, request: HTTPRequest, rpc: Request) -> Response:
        rpc = Request(rpc.id, "listSubscriptions", None)
        route = await self._authenticate(request, rpc)
        return JSONResponse(await self.bus.handle(route, rpc))

    async def _subscribe(self, request: HTTPRequest, rpc: Request) -> Response:
        rpc = Request(rpc.id, "subscribe", None)
        route = await self._authenticate(request, rpc)
        try:
            value, size = await self._body(request, route.client_id)
            self.bus.byte_budget.give(size)
            body = parse(SubscriptionBody, value)
        except BusError as exc:
            await self.bus.record_error(route.client_id, rpc, exc)
            raise
        rpc = Request(rpc.id, "subscribe", {"topic": body.topic})
        return JSONResponse(await self.bus.handle(route, rpc))

    async def _unsubscribe(self, request: HTTPRequest, rpc: Request) -> Response:
        rpc = Request(rpc.id, "unsubscribe", dict(request.query_params))
        route = await self._authenticate(request, rpc)
        return JSONResponse(await self.bus.handle(route, rpc))

    async def _discovery(self, request: HTTPRequest) -> Response:
        discovery = _discovery(self.bus, self.settings, self.url)
        return JSONResponse(discovery.model_dump(mode="json", by_alias=True))

    async def _metrics(self, request: HTTPRequest) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    async def _health(self, request: HTTPRequest) -> Response:
        if self._closing:
            return PlainTextResponse("shutting down\n", status_code=503)
        return PlainTextResponse("ok\n")

    async def _openapi(self, request: HTTPRequest) -> Response:
        return JSONResponse(openapi_document(server_url=self.url))

    # Helpers

    async def _authenticate(self, request: HTTPRequest, rpc: Request) -> BusRoute[Any]:
        """The route of the peer whose token the request carries; its connection stops
        counting against the per-address cap of anonymous ones.

        Raises:
            AuthenticationFailed: no such peer: counted in :attr:`refusals` (one row per
                interval), or, when the policy refuses its roles, logged and committed first.
        """
        address = request.client.host if request.client is not None else "unknown"
        token = _bearer(request.headers.get("authorization"))
        if self.bus.credentials.identify(token) is None:
            # Anyone can send this: counted, and logged once per interval, not once each.
            self.refusals.count("unknown_token" if token else "no_credential", address)
            raise AuthenticationFailed(
                "Authentication failed: send Authorization: Bearer with the token "
                "`bcpbus peers add` printed"
            )
        try:
            route = await self.bus.route_for_token(token, rpc, address=address)
        except BusError as exc:
            await self.bus.record_error(address, rpc, exc)
            raise
        if request.client is not None:
            self.guard.authenticated(request.client.host, request.client.port)
        return route

    async def _body(self, request: HTTPRequest, actor: str) -> tuple[Any, int]:
        """The request's JSON body and its size, charged to the bus's byte budget: give it
        back when the request is done. Raises as :func:`_read_body`."""
        return await _read_body(request, self.bus, self.settings.body_timeout, actor)

    async def settled(self) -> None:
        """Return once the requests taken so far are done: delivered, their bytes given back."""
        await self._posted.finish(None)


async def _read_body(
    request: HTTPRequest, bus: BusPort, body_timeout: float | None, actor: str
) -> tuple[Any, int]:
    """The request's JSON body, read up to ``max_frame_bytes``, and its size, which is
    charged to the bus's byte budget: give it back when the request is done.

    Raises:
        BodyTooLarge: it is larger (logged as ``frame_too_large``).
        BodyTimeout: it did not all come within ``body_timeout`` (a ``limit_exceeded``
            row, status ``http_body_timeout``).
        LimitExceeded: it does not fit in ``max_inflight_bytes`` now.
        ParseError: it is not JSON (nothing stays charged).
    """
    limit = bus.limits.max_frame_bytes
    declared = request.headers.get("content-length", "")
    if limit is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(bus, actor, limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(body_timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if limit is not None and size > limit:
                    raise _too_large(bus, actor, limit)
                chunks.append(chunk)
    except TimeoutError:
        seconds = body_timeout
        bus.log.record(LogEvent.LIMIT_EXCEEDED, actor=actor, status="http_body_timeout")
        raise BodyTimeout(
            f"Request body not received within body_timeout ({seconds:g} s)"
        ) from None
    budget = bus.byte_budget
    if not budget.take(size):
        bus.log.record(LogEvent.LIMIT_EXCEEDED, actor=actor, status="max_inflight_bytes")
        raise _budget_exceeded()
    try:
        return loads(b"".join(chunks).decode("utf-8")), size
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        budget.give(size)
        raise ParseError("Parse error: the body is not valid JSON") from None


def _too_large(bus: BusPort, actor: str, limit: int) -> BodyTooLarge:
    bus.log.record(LogEvent.FRAME_TOO_LARGE, actor=actor, error=f"limit {limit}")
    return BodyTooLarge(f"Request body larger than max_frame_bytes ({limit} bytes)")


class _Posted:
    """The messages posted over HTTP still being handled or delivered: at most
    ``max_requests`` of them, each holding its body's bytes in the bus's budget until its
    delivery ends; :meth:`finish` waits for them when the binding closes.

    Args:
        bus: whose budget and log they use.
        limit: the most at once (``max_requests``); None for no limit.
    """

    def __init__(self, bus: BusPort, limit: int | None) -> None:
        self.bus, self.limit = bus, limit
        self._tasks: set[asyncio.Task[Any]] = set()

    def check(self, actor: str) -> None:
        """Refuse a message when ``max_requests`` are being handled or delivered already.

        Raises:
            LimitExceeded: logged as ``limit_exceeded`` (status ``http_max_requests``).
        """
        limit = self.limit
        if limit is None or len(self._tasks) < limit:
            return
        self.bus.log.record(LogEvent.LIMIT_EXCEEDED, actor=actor, status="http_max_requests")
        raise LimitExceeded(
            f"Limit exceeded: {limit} messages posted over HTTP are still being delivered "
            "(max_requests); retry later"
        )

    def own(self, coro: Coroutine[Any, Any, Any], charge: int) -> asyncio.Task[Any]:
        """Run ``coro``, a request whose body took ``charge`` bytes of the budget, until it
        and the deliveries it leaves running end; then give the bytes back."""
        # Its bytes stay charged after it ends while a delivery it did not wait for (to a more
        # tainted receiver) still holds the message, as a WebSocket request's do.
        context, release = charged_context(self.bus.byte_budget, charge)
        task = asyncio.get_running_loop().create_task(coro, context=context)
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._done(done, release))
        return task

    def _done(self, task: asyncio.Task[Any], release: Callable[[], None]) -> None:
        self._tasks.discard(task)
        release()
        if not task.cancelled() and isinstance(task.exception(), Exception):
            # Answered already (202) or by the handler: retrieving it keeps asyncio quiet.
            logger.debug("request ended with %r", task.exception())

    async def finish(self, grace: float | None) -> None:
        """Wait up to ``grace`` seconds (None: as long as it takes) for the requests to end,
        then cancel the rest."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)


class _Listener:
    """The listening socket and the uvicorn server of one binding: start, where, stop."""

    def __init__(self, host: str, ssl: _ssl.SSLContext | None) -> None:
        self.host = host
        self.ssl = ssl
        self._server: uvicorn.Server | None = None
        self._socket: socket.socket | None = None
        self._ticker: asyncio.Task[None] | None = None

    async def start(self, server: uvicorn.Server, port: int) -> None:
        """Listen on ``port`` (0: a free one) and serve with ``server``.

        Raises:
            OSError: the port cannot be listened on.
        """
        sock = listen(self.host, port)
        await server.startup(sockets=[sock])
        self._server, self._socket = server, sock
        # uvicorn's own loop refreshes the Date header once a second; stop() ends it.
        self._ticker = asyncio.create_task(server.main_loop())

    @property
    def port(self) -> int:
        if self._socket is None:
            raise RuntimeError("the HTTP binding is not started")
        port: int = self._socket.getsockname()[1]
        return port

    @property
    def url(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        scheme = "https" if self.ssl is not None else "http"
        return f"{scheme}://{host}:{self.port}"

    async def stop(self) -> None:
        """Stop accepting, and let uvicorn finish the requests in flight (its graceful
        shutdown timeout); nothing to do if never started."""
        server = self._server
        if server is None:
            return
        server.should_exit = True
        if self._ticker is not None:
            await self._ticker
        await server.shutdown(sockets=[self._socket] if self._socket else None)


def _uvicorn(binding: HttpBinding, shutdown_grace: float | None) -> uvicorn.Server:
    """A uvicorn server for ``binding``'s app, with its limits and TLS; not started yet."""
    settings = binding.settings
    config = uvicorn.Config(
        binding.app,
        lifespan="off",
        log_config=None,
        access_log=False,
        proxy_headers=False,
        server_header=False,
        limit_concurrency=settings.max_connections,
        http=guarded_protocol(binding.guard),
        h11_max_incomplete_event_size=settings.max_header_bytes,
        timeout_keep_alive=settings.keep_alive_timeout,
        timeout_graceful_shutdown=int(shutdown_grace or 10) or 1,
    )
    config.load()
    # The bus's own context, so the certificate, the TLS versions and a reload of the
    # files are the WebSocket port's (uvicorn would build one of its own from paths).
    config.ssl = binding.ssl
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    return server


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: a free port) for uvicorn.

    Made with ``IPPROTO_TCP`` as its protocol, as asyncio's own ``create_server`` makes them:
    asyncio turns Nagle's algorithm off (``TCP_NODELAY``) only on sockets that say so, and
    :func:`socket.create_server` says 0. With Nagle on, a response written in two parts (its
    head, then its body) waits for the client's delayed ACK: 40 ms per request.

    Raises:
        OSError: ``host:port`` cannot be listened on.
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    return sock


def _discovery(bus: BusPort, settings: HttpSettings, url: str) -> Discovery:
    """What ``GET /.well-known/bcpbus`` says about ``bus`` and its HTTP binding at ``url``."""
    return Discovery(
        version=__version__,
        server_id=bus.server_id,
        endpoints=Endpoints(websocket=bus.url, http=url),
        methods=bus.methods,
        capabilities={
            "websocket": True,
            "http": True,
            "webhooks": True,
            "metrics": True,
            "traceparent": True,
            "epochs": True,
            "fetch": True,
        },
        limits={
            **asdict(bus.limits),
            "webhook_timeout": settings.webhook_timeout,
            "webhook_attempts": settings.webhook_attempts,
            "webhook_max_answer_bytes": settings.webhook_max_answer_bytes,
            "http_header_timeout": settings.header_timeout,
            "http_body_timeout": settings.body_timeout,
            "http_max_anonymous_per_address": settings.max_anonymous_per_address,
        },
    )


def _bearer(header: str | None) -> str | None:
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    return None


def _flag(value: str | None, name: str) -> bool:
    if value is None or value in ("false", "0", ""):
        return False
    if value in ("true", "1"):
        return True
    raise InvalidParams(f"Invalid params: {name} must be true or false, not {value[:20]!r}")


def _with_traceparent(body: dict[str, Any], header: str) -> dict[str, Any]:
    """``body`` with the ``traceparent`` header as its ``traceparent``.

    Raises:
        InvalidParams: the body has another one.
    """
    given = body.get("traceparent")
    if given is not None and given != header:
        raise InvalidParams("Invalid params: the traceparent header and body field differ")
    return {**body, "traceparent": header}


def _next_page(request: HTTPRequest, next_epoch: int) -> str:
    """The path and query of the page after this one: the same query from ``next_epoch``."""
    query = {**request.query_params, "since": str(next_epoch)}
    return f"{request.url.path}?{urlencode(query)}"


def _send_params(message: PostMessage, client_id: str) -> dict[str, Any]:
    """The ``sendMessage`` params of a POSTed message, sent as ``client_id``."""
    payload: dict[str, Any] = {
        "messageId": message.message_id or f"http-{uuid.uuid4().hex}",
        "type": message.type,
        "from": client_id,
        "timestamp": timestamp(),
        "content": message.content,
    }
    if message.correlation_id is not None:
        payload["correlationId"] = message.correlation_id
    if message.traceparent is not None:
        payload["traceparent"] = message.traceparent
    return {"topic": message.topic, "payload": payload}


def _budget_exceeded() -> BusError:
    return LimitExceeded(
        "Limit exceeded: the bus is handling too many bytes of requests (max_inflight_bytes); "
        "retry later"
    )


def _error(exc: BusError) -> Response:
    status = exc.http_status
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
    if status in (408, 413):
        # The rest of the body is still coming, or never will: do not wait for it.
        headers["Connection"] = "close"
    return JSONResponse({"error": exc.to_error()}, status_code=status, headers=headers)
