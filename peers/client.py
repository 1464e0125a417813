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
(``reconnect=False`` turns that off); given several bus URLs, it tries the next one first, then
the others in turn, one per attempt (failover between the nodes of one bus, or standbys). Then
it catches up: it fetches what was sent on its subscriptions after the last epoch it saw and
hands it to the handlers in epoch order, before any new delivery, each message once
(``resume=False`` turns that off). ``on_connection`` hears each of these moments
(:data:`ConnectionEvent`), so a program can say so; a peer whose credentials the bus refuses on
a reconnect (a revoked or rotated token, close code 4005) stops reconnecting and says
:class:`GaveUp`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import ssl
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence, Set
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
from bus.core.calls import PendingCalls
from bus.core.protocol import ErrorResponse, Notification, Request, Response, Session
from bus.core.pushes import PushOptions, push_window
from bus.core.topics import matches
from bus.transports.local import Socket
from schemas.bus import (
    FetchMessagesResult,
    InitializeResult,
    ListSubscriptionsResult,
    PingResult,
    SendMessageResult,
    SubscriptionInfo,
)

from .errors import (
    AuditUnavailable,
    AuthenticationFailed,
    ConnectFailed,
    EpochNotKept,
    InvalidURL,
    PeerClosed,
    PeerError,
    PeerTimeout,
    RequestRefused,
    ShuttingDown,
    refused,
)
from .urls import bus_urls

# PeerClosed is defined in .errors; it stays importable from here, where it always was.
__all__ = [
    "ConnectionEvent",
    "Disconnected",
    "FetchPage",
    "GaveUp",
    "Handler",
    "Message",
    "Peer",
    "PeerClosed",
    "Reconnected",
    "Reply",
    "backoff",
]

logger = logging.getLogger("peers.client")

CATCH_UP_PAGE = 500
"""Messages asked for per ``fetchMessages`` call while catching up."""


@dataclass(frozen=True, slots=True)
class Message:
    """One delivery from the bus, pushed or fetched."""

    topic: str
    payload: dict[str, Any]
    epoch: int | None = None
    """The message's place in the bus's order (None from a bus older than epochs)."""
    skipped: int | None = None
    """On a push that ends a ``debounceMs`` window: how many messages on this topic were not
    pushed in it (fetch them by epoch if you need them)."""

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
class FetchPage:
    """One ``fetchMessages`` answer: messages oldest first, where to go on, whether to."""

    messages: list[Message]
    next_epoch: int
    """Pass it as ``since_epoch`` to read on."""
    more: bool
    """Whether there may be more after :attr:`next_epoch`."""


@dataclass(frozen=True, slots=True)
class Reply:
    """What a handler answers ``processMessage`` with when a bool is not enough."""

    processed: bool = True
    status: str = "ok"
    message: str = ""

    def to_result(self) -> dict[str, Any]:
        return {"processed": self.processed, "status": self.status, "message": self.message}


Handler = Callable[[Message], Awaitable[Reply | bool | None]]


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The connection ended without :meth:`Peer.close`; the peer reconnects if it may.

    .. versionadded:: 0.2
    """

    closed: PeerClosed
    """Why: its ``code`` and ``reason`` are the bus's close frame (1001: the bus stopped)."""
    reconnecting: bool


@dataclass(frozen=True, slots=True)
class Reconnected:
    """A reconnect succeeded: initialized and subscribed again. The catch-up from
    ``last_epoch`` (None: none, without epochs or ``resume``) runs next.

    .. versionadded:: 0.2
    """

    last_epoch: int | None


@dataclass(frozen=True, slots=True)
class GaveUp:
    """The bus refused the credentials on a reconnect: the peer stopped reconnecting. The
    token was revoked or rotated (the connection closed with 4005 just before), or the policy
    no longer admits the clientId; a new token is needed.

    .. versionadded:: 0.2
    """

    error: AuthenticationFailed


ConnectionEvent = Disconnected | Reconnected | GaveUp
"""What ``Peer(on_connection=...)`` is told, in the order it happens."""


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
        url: the bus, ``ws://host:port``; or several, as a list or a comma-separated string,
            to fail over between (:mod:`peers.urls`): :meth:`connect` takes the first that
            answers, a reconnect tries the next one first, then the others in turn.
        client_id: this peer's identity, ``prefix:name``.
        token: the secret that proves it (from ``bcpbus peers add``).
        reconnect: reconnect, re-initialize and re-subscribe when the connection drops.
        request_timeout: seconds to wait for the bus to answer a request; None waits forever.
        auth_header: send the token as ``Authorization: Bearer`` at the handshake instead of in
            ``initialize``.
        connector: opens the connection instead of a WebSocket to ``url``; a peer in the bus's
            own process passes :meth:`bus.server.Bus.connect_local` (see
            :mod:`bus.transports.local`).
        resume: after a reconnect, fetch what was missed and hand it to the handlers first.
        cafile: for a ``wss://`` url, trust only the CA certificates in this PEM file (a private
            CA, a self-signed bus); by default the system's.
        ssl_context: for a ``wss://`` url, the TLS context to connect with (overrides
            ``cafile``).
        on_connection: called with each :data:`ConnectionEvent` (a drop, a reconnect, giving
            up), e.g. to tell a user; it must not block.

    Raises:
        InvalidURL: ``url`` names no URL, or ``cafile`` cannot be loaded.

    .. versionchanged:: 0.3 ``url`` may name several buses.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        client_id: str,
        token: str,
        *,
        reconnect: bool = True,
        request_timeout: float | None = 30.0,
        auth_header: bool = False,
        connector: Callable[[], Awaitable[Socket]] | None = None,
        resume: bool = True,
        cafile: str | os.PathLike[str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        on_connection: Callable[[ConnectionEvent], None] | None = None,
    ) -> None:
        self.urls = bus_urls(url)
        """Every bus this peer may connect to, in order of preference."""
        self._at = 0  # the index in urls of the bus connected to, or tried last
        self.on_connection = on_connection
        self.gave_up: AuthenticationFailed | None = None
        """Set when the peer stopped reconnecting because the bus refused its credentials."""
        self._ssl = ssl_context or _tls(self.urls, cafile)
        self.client_id = client_id
        self._token = token
        self.reconnect = reconnect
        self.request_timeout = request_timeout
        self.auth_header = auth_header
        self._connector = connector
        self.server_info: InitializeResult | None = None
        """The last ``initialize`` result; None before the first connect."""
        self.connected = asyncio.Event()
        self._handlers: dict[str | None, Handler] = {}
        # pattern -> its subscribe params, restored after a reconnect
        self._subscriptions: dict[str, dict[str, Any]] = {}
        self._ws: Socket | None = None
        self._session = Session()
        self._pending = PendingCalls()
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = PeerClosed(f"{client_id} is not connected")
        """What calls fail with while there is no connection: set when one ends."""
        self.resume = resume
        self.last_epoch: int | None = None
        """The epoch a reconnect catches up from: the latest of the first ``initialize`` and
        of the messages handed to handlers (None from a bus without epochs)."""
        # Set while deliveries may reach the handlers; cleared while a reconnect catches up,
        # so that pushes wait for the missed messages to be handed over first.
        self._delivering = asyncio.Event()
        self._delivering.set()
        # While a catch-up is unfinished (from the reconnect until it succeeds), last_epoch
        # stays put and the epochs handed meanwhile are remembered here instead, so that the
        # next catch-up skips them.
        self._catching_up = False
        self._handed: set[int] = set()
        self._fetched: set[int] = set()  # the last catch-up's epochs: pushes of them are dropped

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

    async def connect(self) -> InitializeResult:
        """Open the connection, authenticate and initialize; return the ``initialize`` result
        (``server_id``, ``capabilities.topics``: what this peer may subscribe to, ``epoch``).

        Raises:
            InvalidURL: ``url`` is not a ``ws://`` or ``wss://`` URI.
            ConnectFailed: the bus cannot be reached or refused the handshake (``status``
                503: it is full or shutting down). With several URLs: none could, and this
                is the last one's failure (each is tried once, in order).
            PeerTimeout: the handshake or ``initialize`` was not answered in time.
            PeerClosed: the bus closed the connection before ``initialize`` was answered.
            AuthenticationFailed: the bus refused the clientId or token.
            RequestRefused: the bus refused ``initialize`` or a ``subscribe`` for another
                reason (the subclass names the code).
        """
        result = await self._open_first()
        self._runner = asyncio.create_task(self._run())
        return result

    @property
    def url(self) -> str:
        """The bus this peer is connected to, or was or will be tried last."""
        return self.urls[self._at]

    async def _open_first(self) -> InitializeResult:
        """Open the first of :attr:`urls` that answers, trying each once, in order."""
        for index in range(len(self.urls)):
            self._at = index
            try:
                return await self._open()
            except (ConnectFailed, PeerTimeout, PeerClosed) as exc:
                if index == len(self.urls) - 1:
                    raise
                logger.info("%s: %s; trying %s", self.client_id, exc, self.urls[index + 1])
        raise AssertionError("unreachable: bus_urls() gives at least one URL")

    async def _open(self) -> InitializeResult:
        resuming = self.resume and self.last_epoch is not None
        if resuming:
            self._catching_up = True
            self._delivering.clear()  # from initialize on, pushes wait for the catch-up
        try:
            result = await self._initialize()
        except BaseException:
            self._delivering.set()
            raise
        if self.last_epoch is None:
            self.last_epoch = result.epoch
        self.connected.set()
        if resuming:
            self._spawn(self._catch_up())
        return result

    async def _initialize(self) -> InitializeResult:
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
            result = InitializeResult.model_validate(
                await self.request("initialize", params, _ready=True)
            )
            for subscription in self._subscriptions.values():
                await self.request("subscribe", subscription, _ready=True)
        except BaseException:
            reader.cancel()
            await self._ws.close()
            raise
        self._reader = reader
        self.server_info = result
        return result

    async def _connect(self) -> Socket:
        if self._connector is not None:
            return await self._connector()
        headers = {"Authorization": f"Bearer {self._token}"} if self.auth_header else None
        # Translate the transport's exceptions into the SDK's, as httpx's
        # map_httpcore_exceptions does: callers catch PeerError, never a websockets class.
        try:
            # ssl=None would turn TLS off, refused for wss://; a ws:// URL refuses a context.
            if self._ssl is None or not self.url.startswith("wss://"):
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
            if self._closing:
                return
            self._tell(Disconnected(self._closed, reconnecting=self.reconnect))
            if not self.reconnect:
                return
            for delay in backoff():
                await asyncio.sleep(delay)
                if self._closing:
                    return
                # The bus just lost may be down: try the next one first, then each in turn.
                self._at = (self._at + 1) % len(self.urls)
                try:
                    await self._open()
                    logger.info("%s: reconnected to %s", self.client_id, self.url)
                    self._tell(Reconnected(self.last_epoch if self.resume else None))
                    break
                except AuthenticationFailed as exc:
                    logger.error("%s: credentials refused on reconnect; giving up", self.client_id)
                    self.gave_up = exc
                    self._tell(GaveUp(exc))
                    return
                except PeerError as exc:
                    logger.info("%s: reconnect failed: %s", self.client_id, exc)

    def _tell(self, event: ConnectionEvent) -> None:
        if self.on_connection is not None:
            self.on_connection(event)

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
            RequestRefused: the bus answered with an error (the subclass matches the code).
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

    async def subscribe(
        self, pattern: str, *, debounce_ms: int = 0, min_relevance: float = 0.0
    ) -> None:
        """Subscribe to a topic pattern; it is restored, with its options, after a reconnect.

        Args:
            debounce_ms: after a push on a topic, hold further messages on it for this long,
                then push the latest (:attr:`Message.skipped` says how many were not).
            min_relevance: do not push messages whose ``relevance`` is below this.
        """
        params: dict[str, Any] = {"topic": pattern}
        if debounce_ms:
            params["debounceMs"] = debounce_ms
        if min_relevance:
            params["minRelevance"] = min_relevance
        await self.request("subscribe", params)
        self._subscriptions[pattern] = params

    async def unsubscribe(self, pattern: str) -> None:
        """Drop a pattern. Raises :class:`~peers.errors.SubscriptionNotFound` if not
        subscribed."""
        await self.request("unsubscribe", {"topic": pattern})
        self._subscriptions.pop(pattern, None)

    async def list_subscriptions(self) -> list[SubscriptionInfo]:
        """This connection's subscriptions, sorted by pattern, with their options (0: off);
        its own clientId is among them if the bus subscribed it there."""
        result = ListSubscriptionsResult.model_validate(await self.request("listSubscriptions"))
        return result.subscriptions

    async def send(
        self,
        topic: str,
        message_type: str,
        content: dict[str, Any],
        *,
        correlation_id: str | None = None,
        message_id: str | None = None,
    ) -> SendMessageResult:
        """Publish a message; return the bus's answer: ``delivered_to`` counts the peers that
        processed it, ``epoch`` is its place in the bus's order.

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
        result = await self.request("sendMessage", {"topic": topic, "payload": payload})
        return SendMessageResult.model_validate(result)

    async def fetch(self, pattern: str, since_epoch: int = 0, limit: int = 100) -> FetchPage:
        """Read back the messages after ``since_epoch`` on topics matching ``pattern`` that this
        peer may receive, oldest first (``fetchMessages``).

        Raises:
            EpochNotKept: the bus's log does not cover ``since_epoch``; its ``data`` says what
                it keeps.
            ContentNotKept: the bus keeps only digests of messages.
            Forbidden: the policy does not let this peer read ``pattern``.
        """
        params = {"topic": pattern, "sinceEpoch": since_epoch, "limit": limit}
        raw = await self.request("fetchMessages", params)
        # Checked against the model, but handed on as sent: a handler sees the same payload
        # whether the message was pushed or fetched.
        result = FetchMessagesResult.model_validate(raw)
        messages = [
            Message(item["topic"], item["payload"], item["epoch"]) for item in raw["messages"]
        ]
        return FetchPage(messages, result.next_epoch, result.more)

    async def ping(self) -> PingResult:
        """Ask the bus for a sign of life; ``server_time`` is the bus's clock."""
        return PingResult.model_validate(await self.request("ping"))

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
            case Response():
                self._pending.settle(event)
            case ErrorResponse():
                # The SDK's own class for the code: its users catch one root, PeerError.
                self._pending.settle(ErrorResponse(event.id, refused(event.error)))
            case Request():
                self._spawn(self._process(event))
            case Notification():
                pass

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _process(self, request: Request) -> None:
        if not self._delivering.is_set():
            await self._delivering.wait()
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
        message = Message(
            str(request.params.get("topic")),
            payload,
            _optional_int(request.params.get("epoch")),
            _optional_int(request.params.get("skipped")),
        )
        epoch = message.epoch
        if epoch is not None and (epoch in self._fetched or epoch in self._handed):
            return Reply(True, "duplicate", "already handed over by the catch-up")
        self._saw(epoch)
        return await self._hand(message)

    async def _hand(self, message: Message) -> Reply:
        """Call the handler of ``message``'s type and turn its outcome into a reply."""
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

    # Catching up after a reconnect

    def _saw(self, epoch: int | None) -> None:
        """Note that the message at ``epoch`` goes to the handlers."""
        if epoch is None:
            return
        if self._catching_up:
            self._handed.add(epoch)
        elif self.last_epoch is None or epoch > self.last_epoch:
            self.last_epoch = epoch

    async def _catch_up(self) -> None:
        """Hand the handlers, in epoch order, what was sent after :attr:`last_epoch` on this
        connection's subscriptions; then let the deliveries that waited through."""
        since = self.last_epoch
        assert since is not None
        try:
            subscriptions = await self.list_subscriptions()
            fetched = await self._fetch_since(since, [s.topic for s in subscriptions])
            self._fetched = set(fetched)
            gap = _missed(subscriptions, fetched.values(), skip=self._handed)
            for message in gap:
                self._saw(message.epoch)
                await self._hand(message)
        except PeerError as exc:
            if isinstance(exc, RequestRefused) and not isinstance(
                exc, AuditUnavailable | ShuttingDown
            ):
                # The bus cannot give the rest (-32009, -32010): go on without it.
                logger.error("%s: cannot catch up from epoch %s: %s", self.client_id, since, exc)
                self._caught_up(since)
            else:
                # The connection or the bus failed meanwhile: the next reconnect tries again
                # from the same epoch, skipping what was handed.
                logger.warning(
                    "%s: catching up from epoch %s failed: %s", self.client_id, since, exc
                )
        else:
            self._caught_up(max(self._fetched, default=since))
        finally:
            self._delivering.set()

    def _caught_up(self, epoch: int) -> None:
        self._catching_up = False
        self.last_epoch = max(epoch, *self._handed, self.last_epoch or 0)
        self._handed.clear()

    async def _fetch_since(self, since: int, patterns: list[str]) -> dict[int, Message]:
        """Every message after ``since`` on ``patterns``, by epoch, each once.

        Raises:
            RequestRefused: as :meth:`fetch`, but for an epoch the bus no longer keeps, from
                which it reads what is kept, and says so in the log.
        """
        found: dict[int, Message] = {}
        for pattern in patterns:
            cursor, more = since, True
            while more:
                try:
                    page = await self.fetch(pattern, cursor, limit=CATCH_UP_PAGE)
                except EpochNotKept as exc:
                    if cursor != since:
                        raise
                    cursor = _oldest_kept(exc)
                    logger.error(
                        "%s: messages on %s before epoch %s are gone: %s",
                        self.client_id,
                        pattern,
                        cursor + 1,
                        exc,
                    )
                    continue
                found.update((m.epoch, m) for m in page.messages if m.epoch is not None)
                cursor, more = page.next_epoch, page.more
        return found


def _closed(message: str, ws: Socket, cause: ConnectionClosed | None) -> PeerClosed:
    """The PeerClosed that calls on the closed ``ws`` fail with, chained to ``cause``."""
    # A clean close (1000, 1001) ends the iteration without raising; websockets still has the
    # exception it would have raised, which names both close frames.
    if cause is None and isinstance(ws, ClientConnection) and ws.state is State.CLOSED:
        cause = ws.protocol.close_exc
    closed = PeerClosed(message, code=ws.close_code, reason=getattr(ws, "close_reason", None) or "")
    closed.__cause__ = cause
    return closed


def _missed(
    subscriptions: Iterable[SubscriptionInfo], fetched: Iterable[Message], *, skip: Set[int]
) -> list[Message]:
    """What a catch-up hands the handlers: the ``fetched`` messages the ``subscriptions`` would
    have pushed, in epoch order, but those in ``skip``.

    As the bus pushes: a message below every matching subscription's ``minRelevance`` is left
    out; on a topic where every matching subscription that wants it debounces, only the latest
    is handed, with ``skipped`` counting the others.
    """
    subscriptions = list(subscriptions)
    handed: list[Message] = []
    held: dict[str, list[Message]] = {}
    for message in sorted(fetched, key=lambda m: m.epoch or 0):
        if message.epoch in skip:
            continue
        options = [
            PushOptions(s.debounce_ms, s.min_relevance)
            for s in subscriptions
            if matches(s.topic, message.topic)
        ]
        relevance = message.payload.get("relevance")
        window = push_window(options, relevance if isinstance(relevance, int | float) else None)
        if window == 0:
            handed.append(message)
        elif window is not None:
            held.setdefault(message.topic, []).append(message)
    for messages in held.values():
        latest = messages[-1]
        skipped = len(messages) - 1 or None
        handed.append(Message(latest.topic, latest.payload, latest.epoch, skipped))
    return sorted(handed, key=lambda m: m.epoch or 0)


def _oldest_kept(exc: EpochNotKept) -> int:
    """The epoch to fetch from to read what the bus keeps, from its -32009 ``data``."""
    data = exc.data if isinstance(exc.data, dict) else {}
    oldest = data.get("oldestEpoch")
    return oldest - 1 if type(oldest) is int and oldest > 0 else 0


def _optional_int(value: Any) -> int | None:
    return value if type(value) is int else None


def _tls(urls: Sequence[str], cafile: str | os.PathLike[str] | None) -> ssl.SSLContext | None:
    """The TLS context for the ``wss://`` ones of ``urls``: None for the system's CAs (or no
    ``wss://`` at all), else ``cafile``'s."""
    if cafile is None or not any(url.startswith("wss://") for url in urls):
        return None
    url = next(url for url in urls if url.startswith("wss://"))
    try:
        return ssl.create_default_context(cafile=os.fspath(cafile))
    except (OSError, ssl.SSLError) as exc:
        raise InvalidURL(url, f"cannot load the CA file {os.fspath(cafile)}: {exc}") from exc


def _time_out(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(PeerTimeout("no answer from the bus within request_timeout"))
