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
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import (
    InvalidStatus,
    InvalidURI,
    WebSocketException,
)

from bus import __version__
from bus.core.calls import PendingCalls
from bus.core.protocol import Session
from bus.transports.local import Socket
from schemas.bus import (
    InitializeResult,
)

from .catchup import CatchUp
from .errors import (
    AuthenticationFailed,
    ConnectFailed,
    InvalidURL,
    PeerClosed,
    PeerError,
    PeerTimeout,
)
from .handlers import Handlers
from .messages import FetchPage, Handler, Message, Reply
from .methods import BusMethods
from .receiver import Receiver
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


class Peer(BusMethods, Receiver):
    """A connection to the bus under one clientId.

    Args:
        url: the bus, ``ws://host:port``; or several, as a list or a comma-separated string,
            to fail over between (:mod:`peers.urls`): :meth:`connect` takes the first that
            answers, a reconnect tries the next one first, then the others in turn.
        client_id: this peer's identity, ``prefix:name``.
        token: the secret that proves it (from ``bcpbus peers add``).
        reconnect: reconnect, re-initialize and re-subscribe when the connection drops.
        request_timeout: seconds to wait for the bus to answer a request; None waits forever.
        auth_header: send the token as ``Authorization: Bearer`` at the handshake as well as
            in ``initialize`` (the default), so that anonymous sockets filling the bus's caps
            cannot keep it out; False sends it in ``initialize`` only, and such a peer is a
            stranger until then: past its address's cap it closes the oldest idle one (4006),
            past the bus-wide cap it gets the handshake's HTTP 503.
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
        auth_header: bool = True,
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
        self._handlers = Handlers(client_id)
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
        self._catch = CatchUp()

    @property
    def last_epoch(self) -> int | None:
        """The epoch a reconnect catches up from: the latest of the first ``initialize`` and
        of the messages handed to handlers (None before the first connect)."""
        return self._catch.last_epoch

    # Handlers

    def on(self, message_type: str | None = None) -> Callable[[Handler], Handler]:
        """Register the decorated coroutine for deliveries of ``message_type``; see
        :meth:`peers.handlers.Handlers.on`."""
        return self._handlers.on(message_type)

    def handle(self, message_type: str | None, handler: Handler) -> None:
        """Register ``handler`` for ``message_type``, like :meth:`on` without the decorator."""
        self._handlers.handle(message_type, handler)

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
            self._catch.begin()  # from initialize on, pushes wait for the catch-up
        try:
            result = await self._initialize()
        except BaseException:
            self._catch.delivering.set()
            raise
        if self._catch.last_epoch is None:
            self._catch.last_epoch = result.epoch
        self.connected.set()
        if resuming:
            self._spawn(self._catch.run(self, self._handlers.hand))
        return result

    async def _initialize(self) -> InitializeResult:
        if self._connector is not None:
            self._ws = await self._connector()
        else:
            self._ws = await _open_socket(self.url, self._token, self.auth_header, self._ssl)
        self._session = Session()
        reader = asyncio.create_task(self._read(self._ws))
        try:
            params: dict[str, Any] = {
                "clientId": self.client_id,
                "clientInfo": {"name": "bcpbus-peer", "version": __version__},
                # Here too with the header: a proxy that drops Authorization loses nothing.
                "auth": {"token": self._token},
            }
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


async def _open_socket(
    url: str, token: str, auth_header: bool, context: ssl.SSLContext | None
) -> Socket:
    """A WebSocket to the bus at ``url``, the token in the handshake if ``auth_header``.

    Raises:
        InvalidURL, ConnectFailed, PeerTimeout: as :meth:`Peer.connect`.
    """
    headers = {"Authorization": f"Bearer {token}"} if auth_header else None
    # Translate the transport's exceptions into the SDK's, as httpx's
    # map_httpcore_exceptions does: callers catch PeerError, never a websockets class.
    try:
        # ssl=None would turn TLS off, refused for wss://; a ws:// URL refuses a context.
        if context is None or not url.startswith("wss://"):
            return await connect(url, additional_headers=headers, compression=None, max_size=None)
        return await connect(
            url,
            additional_headers=headers,
            compression=None,
            max_size=None,
            ssl=context,
        )
    except InvalidURI as exc:
        raise InvalidURL(url, exc.msg) from exc
    except InvalidStatus as exc:
        status = exc.response.status_code
        detail = f"the bus answered HTTP {status}"
        raise ConnectFailed(url, detail, status=status) from exc
    except TimeoutError as exc:  # before OSError, of which it is a subclass
        raise PeerTimeout(f"no handshake with {url} in time") from exc
    except (OSError, WebSocketException) as exc:
        raise ConnectFailed(url, str(exc) or type(exc).__name__) from exc


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
