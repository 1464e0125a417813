"""The Python peer SDK: connect to a bcpbus, subscribe, send, and answer deliveries.

::

    async with Peer("ws://127.0.0.1:8765", "agent:main", token) as peer:
        @peer.on("bcp_response_delivery")
        async def delivered(message: Message) -> None:
            print(message.content["response"])

        await peer.subscribe("agent:main")
        await peer.send("bcp:main:researcher", "bcp_query_request", {...})

A handler returns None (processed), a bool, or a :class:`Reply`; an exception it raises is
answered ``processed: false``. Handlers run concurrently, so a handler may itself ``send``.
When the connection drops, the peer reconnects with backoff, initializes again and re-subscribes
(``reconnect=False`` turns that off).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import ssl
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import (
    ConnectionClosed,
    InvalidStatus,
    InvalidURI,
    WebSocketException,
)
from websockets.protocol import State

from bus import __version__
from bus.calls import PendingCalls
from bus.errors import AuthenticationFailed, BusError
from bus.local import Socket
from bus.protocol import ErrorResponse, Notification, Request, Response, Session

from .errors import ConnectFailed, InvalidURL, PeerClosed, PeerError, PeerTimeout

# PeerClosed is defined in .errors; it stays importable from here, where it always was.
__all__ = ["Handler", "Message", "Peer", "PeerClosed", "Reply", "backoff"]

logger = logging.getLogger("peers.client")


@dataclass(frozen=True, slots=True)
class Message:
    """One delivery from the bus."""

    topic: str
    payload: dict[str, Any]

    @property
    def type(self) -> str:
        return str(self.payload["type"])

    @property
    def sender(self) -> str:
        """The payload's ``from``: the authenticated clientId of the peer that sent it."""
        return str(self.payload["from"])

    @property
    def message_id(self) -> str:
        return str(self.payload["messageId"])

    @property
    def content(self) -> dict[str, Any]:
        content: dict[str, Any] = self.payload["content"]
        return content


@dataclass(frozen=True, slots=True)
class Reply:
    """What a handler answers ``processMessage`` with when a bool is not enough."""

    processed: bool = True
    status: str = "ok"
    message: str = ""

    def to_result(self) -> dict[str, Any]:
        return {"processed": self.processed, "status": self.status, "message": self.message}


Handler = Callable[[Message], Awaitable[Reply | bool | None]]


def backoff(
    initial: float = 0.1, maximum: float = 10.0, factor: float = 1.8, jitter: float = 0.2
) -> Iterator[float]:
    """Yield reconnect delays in seconds: growing by ``factor`` up to ``maximum``, each spread by
    up to ``jitter`` of itself so that many peers don't reconnect in lockstep."""
    delay = initial
    while True:
        yield delay * (1 + random.uniform(-jitter, jitter))
        delay = min(maximum, delay * factor)


class Peer:
    """A connection to the bus under one clientId.

    Args:
        url: the bus, ``ws://host:port``.
        client_id: this peer's identity, ``prefix:name``.
        token: the secret that proves it (from ``bcpbus peers add``).
        reconnect: reconnect, re-initialize and re-subscribe when the connection drops.
        request_timeout: seconds to wait for the bus to answer a request; None waits forever.
        auth_header: send the token as ``Authorization: Bearer`` at the handshake instead of in
            ``initialize``.
        connector: opens the connection instead of a WebSocket to ``url``; a peer in the bus's
            own process passes :meth:`bus.server.Bus.connect_local` (see :mod:`bus.local`).
        cafile: for a ``wss://`` url, trust only the CA certificates in this PEM file (a private
            CA, a self-signed bus); by default the system's.
        ssl_context: for a ``wss://`` url, the TLS context to connect with (overrides
            ``cafile``).

    Raises:
        InvalidURL: ``cafile`` cannot be loaded.
    """

    def __init__(
        self,
        url: str,
        client_id: str,
        token: str,
        *,
        reconnect: bool = True,
        request_timeout: float | None = 30.0,
        auth_header: bool = False,
        connector: Callable[[], Awaitable[Socket]] | None = None,
        cafile: str | os.PathLike[str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.url = url
        self._ssl = ssl_context or _tls(url, cafile)
        self.client_id = client_id
        self._token = token
        self.reconnect = reconnect
        self.request_timeout = request_timeout
        self.auth_header = auth_header
        self._connector = connector
        self.server_info: dict[str, Any] = {}
        """The last ``initialize`` result."""
        self.connected = asyncio.Event()
        self._handlers: dict[str | None, Handler] = {}
        self._subscriptions: list[str] = []
        self._ws: Socket | None = None
        self._session = Session()
        self._pending = PendingCalls()
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = PeerClosed(f"{client_id} is not connected")
        """What calls fail with while there is no connection: set when one ends."""

    # Handlers

    def on(self, message_type: str | None = None) -> Callable[[Handler], Handler]:
        """Register the decorated coroutine for deliveries of ``message_type``.

        ``None`` registers the fallback for types without a handler of their own. Deliveries of
        a type with no handler and no fallback are answered ``processed: false``.
        """

        def register(handler: Handler) -> Handler:
            self._handlers[message_type] = handler
            return handler

        return register

    def handle(self, message_type: str | None, handler: Handler) -> None:
        """Register ``handler`` for ``message_type``, like :meth:`on` without the decorator."""
        self._handlers[message_type] = handler

    # Lifecycle

    async def connect(self) -> dict[str, Any]:
        """Open the connection, authenticate and initialize; return the ``initialize`` result.

        Raises:
            InvalidURL: ``url`` is not a ``ws://`` or ``wss://`` URI.
            ConnectFailed: the bus cannot be reached or refused the handshake (``status``
                503: it is full or shutting down).
            PeerTimeout: the handshake or ``initialize`` was not answered in time.
            PeerClosed: the bus closed the connection before ``initialize`` was answered.
            AuthenticationFailed: the bus refused the clientId or token.
            BusError: the bus refused ``initialize`` or a ``subscribe`` for another reason.
        """
        result = await self._open()
        self._runner = asyncio.create_task(self._run())
        return result

    async def _open(self) -> dict[str, Any]:
        self._ws = await self._connect()
        self._session = Session()
        reader = asyncio.create_task(self._read(self._ws))
        try:
            params: dict[str, Any] = {
                "clientId": self.client_id,
                "clientInfo": {"name": "bcpbus-peer", "version": __version__},
            }
            if not self.auth_header or self._connector is not None:  # no handshake, no header
                params["auth"] = {"token": self._token}
            result: dict[str, Any] = await self.request("initialize", params, _ready=True)
            for pattern in self._subscriptions:
                await self.request("subscribe", {"topic": pattern}, _ready=True)
        except BaseException:
            reader.cancel()
            await self._ws.close()
            raise
        self._reader = reader
        self.server_info = result
        self.connected.set()
        return result

    async def _connect(self) -> Socket:
        if self._connector is not None:
            return await self._connector()
        headers = {"Authorization": f"Bearer {self._token}"} if self.auth_header else None
        # Translate the transport's exceptions into the SDK's, as httpx's
        # map_httpcore_exceptions does: callers catch PeerError, never a websockets class.
        try:
            if self._ssl is None:  # ssl=None would turn TLS off, refused for wss://
                return await connect(
                    self.url, additional_headers=headers, compression=None, max_size=None
                )
            return await connect(
                self.url,
                additional_headers=headers,
                compression=None,
                max_size=None,
                ssl=self._ssl,
            )
        except InvalidURI as exc:
            raise InvalidURL(self.url, exc.msg) from exc
        except InvalidStatus as exc:
            status = exc.response.status_code
            detail = f"the bus answered HTTP {status}"
            raise ConnectFailed(self.url, detail, status=status) from exc
        except TimeoutError as exc:  # before OSError, of which it is a subclass
            raise PeerTimeout(f"no handshake with {self.url} in time") from exc
        except (OSError, WebSocketException) as exc:
            raise ConnectFailed(self.url, str(exc) or type(exc).__name__) from exc

    async def _run(self) -> None:
        while True:
            if self._reader is not None:
                await asyncio.wait([self._reader])
            self.connected.clear()
            self._fail_pending()
            if self._closing or not self.reconnect:
                return
            for delay in backoff():
                await asyncio.sleep(delay)
                if self._closing:
                    return
                try:
                    await self._open()
                    logger.info("%s: reconnected", self.client_id)
                    break
                except AuthenticationFailed:
                    logger.error("%s: credentials refused on reconnect; giving up", self.client_id)
                    return
                except (PeerError, BusError) as exc:
                    logger.info("%s: reconnect failed: %s", self.client_id, exc)

    async def close(self) -> None:
        """Close the connection and stop reconnecting; wait for running handlers. Idempotent."""
        self._closing = True
        # Handlers still running may need the socket to finish (a handler that sends): let
        # them end first, then close.
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5)
        if self._ws is not None:
            await self._ws.close()
        if self._runner is not None:
            await self._runner
        self._fail_pending()

    async def __aenter__(self) -> Peer:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # Calls

    async def request(self, method: str, params: Any = None, *, _ready: bool = False) -> Any:
        """Call a bus method and return its result.

        Raises:
            BusError: the bus answered with an error (the subclass matches the code).
            PeerClosed: not connected, or the connection closed before the answer; the
                transport's exception, if there was one, is the ``__cause__``.
            PeerTimeout: no answer within ``request_timeout``.
        """
        ws = self._ws
        if ws is None or (not _ready and not self.connected.is_set()):
            closed = PeerClosed(
                f"{self.client_id} is not connected",
                code=self._closed.code,
                reason=self._closed.reason,
            )
            raise closed from self._closed.__cause__
        request_id = self._session.send_request(method, params)
        loop = asyncio.get_running_loop()
        future = self._pending.expect(request_id)
        timer = None
        try:
            await self._flush(ws)
            if self.request_timeout is not None and not future.done():
                # A timer that fails the future costs less than asyncio.timeout(), which
                # cancels and uncancels the task; the caller sees the same TimeoutError.
                timer = loop.call_later(self.request_timeout, _time_out, future)
            return await future
        finally:
            self._pending.forget(request_id)
            if timer is not None:
                timer.cancel()

    async def subscribe(self, pattern: str) -> None:
        """Subscribe to a topic pattern; it is restored after a reconnect."""
        await self.request("subscribe", {"topic": pattern})
        if pattern not in self._subscriptions:
            self._subscriptions.append(pattern)

    async def unsubscribe(self, pattern: str) -> None:
        """Drop a pattern. Raises :class:`bus.errors.SubscriptionNotFound` if not subscribed."""
        await self.request("unsubscribe", {"topic": pattern})
        if pattern in self._subscriptions:
            self._subscriptions.remove(pattern)

    async def send(
        self,
        topic: str,
        message_type: str,
        content: dict[str, Any],
        *,
        correlation_id: str | None = None,
        message_id: str | None = None,
    ) -> dict[str, Any]:
        """Publish a message; return the bus's ``{accepted, messageId, deliveredTo}``.

        The envelope (``messageId``, ``from``, ``timestamp``) is filled in for you.
        """
        payload: dict[str, Any] = {
            "messageId": message_id or uuid.uuid4().hex,
            "type": message_type,
            "from": self.client_id,
            "timestamp": datetime.now(UTC).isoformat(),
            "content": content,
        }
        if correlation_id is not None:
            payload["correlationId"] = correlation_id
        result: dict[str, Any] = await self.request(
            "sendMessage", {"topic": topic, "payload": payload}
        )
        return result

    async def ping(self) -> dict[str, Any]:
        """Ask the bus for a sign of life."""
        result: dict[str, Any] = await self.request("ping")
        return result

    # Reading

    async def _read(self, ws: Socket) -> None:
        cause: ConnectionClosed | None = None
        try:
            async for text in ws:
                self._session.receive_text(text)
                for event in self._session.events_received():
                    self._dispatch(event)
                await self._flush(ws)
        except ConnectionClosed as exc:  # closed with an error code: 4001, 4004, 1006...
            cause = exc
        finally:
            self._closed = _closed(f"{self.client_id}: connection closed", ws, cause)
            # Fail the calls waiting for an answer now: during initialize no runner watches
            # this task, and a waiting call would otherwise sit out its whole timeout.
            self._fail_pending()

    def _dispatch(self, event: Request | Notification | Response | ErrorResponse) -> None:
        match event:
            case Response() | ErrorResponse():
                self._pending.settle(event)
            case Request():
                task = asyncio.create_task(self._process(event))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            case Notification():
                pass

    async def _process(self, request: Request) -> None:
        reply = await self._call_handler(request)
        self._session.respond(request, reply.to_result())
        if self._ws is not None:
            await self._flush(self._ws)

    async def _call_handler(self, request: Request) -> Reply:
        if request.method != "processMessage" or not isinstance(request.params, dict):
            return Reply(False, "unsupported", f"this peer does not handle {request.method}")
        # The bus validated the envelope; check only what this code relies on.
        payload = request.params.get("payload")
        if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
            return Reply(False, "invalid", "malformed processMessage params")
        message = Message(str(request.params.get("topic")), payload)
        handler = self._handlers.get(message.type) or self._handlers.get(None)
        if handler is None:
            return Reply(False, "no_handler", f"no handler for {message.type}")
        try:
            outcome = await handler(message)
        except Exception as exc:
            logger.exception("%s: handler for %s failed", self.client_id, message.type)
            return Reply(False, "error", str(exc)[:200])
        if isinstance(outcome, Reply):
            return outcome
        return Reply(outcome is not False)

    async def _flush(self, ws: Socket) -> None:
        for text in self._session.data_to_send():
            try:
                await ws.send(text)
            except ConnectionClosed:
                return

    def _fail_pending(self) -> None:
        self._pending.fail_all(self._closed)


def _closed(message: str, ws: Socket, cause: ConnectionClosed | None) -> PeerClosed:
    """The PeerClosed that calls on the closed ``ws`` fail with, chained to ``cause``."""
    # A clean close (1000, 1001) ends the iteration without raising; websockets still has the
    # exception it would have raised, which names both close frames.
    if cause is None and isinstance(ws, ClientConnection) and ws.state is State.CLOSED:
        cause = ws.protocol.close_exc
    closed = PeerClosed(message, code=ws.close_code, reason=getattr(ws, "close_reason", None) or "")
    closed.__cause__ = cause
    return closed


def _tls(url: str, cafile: str | os.PathLike[str] | None) -> ssl.SSLContext | None:
    """The TLS context for ``url``: None for ``ws://`` or the system's CAs, else ``cafile``'s."""
    if cafile is None or not url.startswith("wss://"):
        return None
    try:
        return ssl.create_default_context(cafile=os.fspath(cafile))
    except (OSError, ssl.SSLError) as exc:
        raise InvalidURL(url, f"cannot load the CA file {os.fspath(cafile)}: {exc}") from exc


def _time_out(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(PeerTimeout("no answer from the bus within request_timeout"))
