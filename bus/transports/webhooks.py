"""Webhook peers: peers the bus reaches over HTTP, for those that cannot hold a WebSocket open.

A peer added with ``bcpbus peers add ID --webhook URL`` is online as long as the bus runs: at
start :class:`Webhooks` joins it to the routing table through a :class:`WebhookLink`
(:meth:`bus.server.Bus.attach`), with the same authorization, subscriptions, log rows and
presence events as a WebSocket peer. Each ``processMessage`` call to it is POSTed to its URL as
the same JSON-RPC request, and the JSON-RPC response in the HTTP answer is its answer::

    POST /bcpbus HTTP/1.1
    Content-Type: application/json
    X-Bcpbus-Timestamp: 1767225600
    X-Bcpbus-Signature: sha256=<HMAC-SHA256 of "1767225600.<body>" under the webhook secret>
    traceparent: 00-...            (when the envelope carries one)

    {"jsonrpc":"2.0","id":7,"method":"processMessage","params":{"topic":...,"payload":...}}

A POST that times out, cannot connect, or is answered 408, 425, 429 or 5xx is retried with
backoff (:func:`retry_delays`), every attempt within the delivery's ``process_timeout``; each
failed attempt has a ``webhook_retry`` row. Any other answer is final. When the last attempt
fails, the delivery fails (``process_finish`` status ``error``), a ``delivery_failed`` row is
logged, and the sender gets a ``delivery_status`` message on its own clientId: a failure, never
silence. Messages the bus itself sent get no ``delivery_status`` (there is nobody to tell, and
one about a failed ``delivery_status`` would never end).

What the webhook wrote (its reason phrase, its body, its error message) goes to the log rows
only. ``delivery_status`` comes from ``system:bus``, which is untainted, to a sender that may be
less tainted than the webhook peer, so it carries codes (:data:`schemas.bus.DeliveryFailure`),
and the HTTP status number only where the taint rule would let the webhook write to the sender.
An answer is read up to ``webhook_max_answer_bytes`` and parsed as strict JSON
(:func:`bus.core._json.loads`: no ``NaN``, no lone surrogate); each attempt, its answer read
included, ends within ``webhook_timeout``. Connections go to public addresses only unless the
operator allows others (:mod:`bus.transports.egress`).

httpx makes the POSTs: it is the client Starlette's test client is built on, typed, with
timeouts per phase and a connection pool, so the HTTP side of the bus has a single client
library. It ignores proxy settings from the environment: the bus calls the URL the peers file
names, and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import socket
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from schemas.bus import DELIVERY_STATUS_TYPE, DeliveryFailure, DeliveryStatus
from schemas.common import timestamp
from schemas.http import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature

from .. import __version__
from ..core._json import dumps, loads
from ..core.errors import AuthenticationFailed, BusError, InternalError
from ..core.logevents import LogEvent
from ..core.policy import may_flow
from ..core.presence import BUS_CLIENT_ID
from ..ops.config import HttpSettings
from ..ops.credentials import Credentials, PeerRecord, Webhook
from ..server import Bus
from .egress import private_host, refusal

__all__ = [
    "RETRY_STATUSES",
    "PublicOnly",
    "WebhookFailed",
    "WebhookLink",
    "Webhooks",
    "retry_delays",
]

logger = logging.getLogger("bus.transports.webhooks")

RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
"""HTTP statuses after which a webhook POST is tried again; any other answer is final."""


def retry_delays(
    initial: float, factor: float = 2.0, cap: float = 8.0, jitter: float = 0.2
) -> Iterator[float]:
    """Seconds to wait before each retry: ``initial``, doubling up to ``cap`` times it, each
    spread by up to ``jitter`` of itself."""
    delay = initial
    while True:
        yield delay * (1 + random.uniform(-jitter, jitter))
        delay = min(initial * cap, delay * factor)


class WebhookFailed(InternalError):
    """A webhook delivery failed for good: no answer after the last attempt.

    Args:
        reason: the log's word for it: ``timeout``, ``connect_error``, ``http_<status>``,
            ``malformed_response``, ``too_large``, ``cancelled``.
        attempts: the POSTs made.
        detail: what the last one got, for the log only: it may hold the webhook's own text.
        http_status: the last answer's status, when there was one; kept as
            :attr:`answer_status`, since ``http_status`` is what the bus's own HTTP binding
            would answer this error with.
    """

    def __init__(
        self, reason: str, attempts: int, detail: str, http_status: int | None = None
    ) -> None:
        self.reason, self.attempts, self.detail = reason, attempts, detail
        self.answer_status = http_status
        super().__init__(f"webhook {reason} after {attempts} attempt(s): {detail}")

    @property
    def failure(self) -> DeliveryFailure:
        """The reason as ``delivery_status`` carries it: a code, never the webhook's text."""
        if self.answer_status is not None:
            return "http_error"
        return _CODES.get(self.reason, "refused")


_CODES: dict[str, DeliveryFailure] = {
    "timeout": "timeout",
    "connect_error": "refused",
    "malformed_response": "bad_answer",
    "too_large": "too_large",
    "cancelled": "cancelled",
}


@dataclass(frozen=True)
class _Attempt:
    """The outcome of one POST: an answer (``result`` or ``error``), or why there was none."""

    result: Any = None
    error: BusError | None = None
    reason: str | None = None
    detail: str = ""
    retry: bool = False
    http_status: int | None = None


class WebhookLink:
    """The bus's link to one webhook peer (a :class:`bus.transports.connection.Link`).

    Args:
        client_id: the peer.
        webhook: its URL, secret and subscriptions.
        hooks: the owner, which holds the HTTP client and the settings and hears of failures.
    """

    kind = "webhook"
    """How the bus reaches this peer, for metrics."""

    def __init__(self, client_id: str, webhook: Webhook, hooks: Webhooks) -> None:
        self.client_id = client_id
        self.webhook = webhook
        self._hooks = hooks
        limit = hooks.bus.limits.max_inflight_deliveries
        self.inflight: asyncio.Semaphore | None = asyncio.Semaphore(limit) if limit else None
        self._ids = itertools.count(1)

    @property
    def name(self) -> str:
        return self.client_id

    def write_buffer_size(self) -> int:
        return 0

    def spawn(self, coro: Any) -> asyncio.Task[None]:
        return self._hooks.spawn(coro)

    async def close(self, code: int, reason: str) -> None:
        """Nothing to close: each POST is its own request."""

    async def call(self, method: str, params: Any) -> Any:
        """POST ``method`` as a JSON-RPC request; return the result the webhook answers.

        Raises:
            BusError: the webhook answered with a JSON-RPC error.
            WebhookFailed: no answer after the last attempt; the failure is reported.
        """
        request_id = next(self._ids)
        body = dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        try:
            return await self._deliver(request_id, body.encode(), params)
        except WebhookFailed as exc:
            self._hooks.failed(self, params, exc)
            raise
        except asyncio.CancelledError:
            # process_timeout or shutdown ended the delivery before its attempts did.
            failure = WebhookFailed(
                "cancelled", 1, "process_timeout or shutdown ended the delivery"
            )
            self._hooks.failed(self, params, failure)
            raise

    async def _deliver(self, request_id: int, body: bytes, params: Any) -> Any:
        settings = self._hooks.settings
        deadline = time.monotonic() + (self._hooks.bus.limits.process_timeout or float("inf"))
        delays = retry_delays(settings.webhook_backoff)
        attempt = _Attempt()
        number = 0
        for number in range(1, settings.webhook_attempts + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                attempt = _Attempt(reason="timeout", detail="process_timeout reached")
                break
            attempt = await self._post(
                request_id, body, params, min(settings.webhook_timeout, left)
            )
            if not attempt.retry:
                break
            delay = next(delays)
            final = number == settings.webhook_attempts or deadline - time.monotonic() <= delay
            self._hooks.bus.log.record(
                LogEvent.WEBHOOK_RETRY,
                message_id=_message_id(params),
                actor=self.client_id,
                status=attempt.reason,
                error=attempt.detail[:200],
                payload={"attempt": number, "final": final},
            )
            if final:
                break
            await asyncio.sleep(delay)
        if attempt.error is not None:
            raise attempt.error
        if attempt.reason is not None:
            raise WebhookFailed(attempt.reason, number, attempt.detail, attempt.http_status)
        return attempt.result

    async def _post(self, request_id: int, body: bytes, params: Any, seconds: float) -> _Attempt:
        stamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"bcpbus/{__version__}",
            # The size cap counts the bytes as sent: no compressed answer to inflate past it.
            "Accept-Encoding": "identity",
            TIMESTAMP_HEADER: stamp,
            SIGNATURE_HEADER: signature(self.webhook.secret, stamp, body),
        }
        trace = _traceparent(params)
        if trace is not None:
            headers["traceparent"] = trace
        try:
            # One deadline for the whole attempt: httpx's timeouts are per phase, and an
            # answer trickled a byte at a time would never trip them.
            async with asyncio.timeout(seconds):
                return await self._exchange(request_id, body, headers, seconds)
        except (httpx.TimeoutException, TimeoutError):
            return _Attempt(reason="timeout", detail=f"no answer within {seconds:.3g}s", retry=True)
        except httpx.HTTPError as exc:
            return _Attempt(reason="connect_error", detail=_describe(exc), retry=True)

    async def _exchange(
        self, request_id: int, body: bytes, headers: dict[str, str], seconds: float
    ) -> _Attempt:
        client = self._hooks.client
        request = client.build_request(
            "POST", self.webhook.url, content=body, headers=headers, timeout=seconds
        )
        response = await client.send(request, stream=True)
        try:
            status = response.status_code
            if not 200 <= status < 300:
                # The reason phrase is the webhook's own text: for the log row only.
                return _Attempt(
                    reason=f"http_{status}",
                    detail=_printable(f"{status} {response.reason_phrase}"),
                    retry=status in RETRY_STATUSES,
                    http_status=status,
                )
            limit = self._hooks.settings.webhook_max_answer_bytes
            content = await _read_at_most(response, limit)
        finally:
            await response.aclose()
        if content is None:
            return _Attempt(
                reason="too_large",
                detail=f"the answer is larger than webhook_max_answer_bytes ({limit} bytes)",
            )
        return _answer(request_id, content)


async def _read_at_most(response: httpx.Response, limit: int | None) -> bytes | None:
    """The body of ``response``, or None as soon as it is past ``limit`` bytes (the rest is
    never read: closing the response drops the connection)."""
    declared = response.headers.get("content-length", "")
    if limit is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_raw():
        size += len(chunk)
        if limit is not None and size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _answer(request_id: int, content: bytes) -> _Attempt:
    """Read the JSON-RPC response in a webhook's 2xx answer, as strict JSON."""
    try:
        message = loads(content)
    except (ValueError, RecursionError):  # NaN, Infinity, lone surrogates, not UTF-8
        return _Attempt(reason="malformed_response", detail="the answer is not strict JSON")
    if not isinstance(message, dict) or message.get("id") != request_id:
        return _Attempt(
            reason="malformed_response", detail="not a JSON-RPC response to this request's id"
        )
    if "error" in message:
        return _Attempt(error=BusError.from_error(message["error"]))
    if "result" not in message:
        return _Attempt(reason="malformed_response", detail="neither result nor error")
    return _Attempt(result=message["result"])


class Webhooks:
    """The webhook peers of one bus: their links, the HTTP client, the failure reports.

    Use it as ``async with Webhooks(bus, credentials, settings):`` around the time the bus
    serves; on exit the peers leave and the reports still being sent are awaited.

    Args:
        bus: the started bus.
        credentials: the peers; those with a webhook are attached.
        settings: timeouts, attempts and backoff.
        client: the HTTP client; None makes one (and closes it on exit).
    """

    def __init__(
        self,
        bus: Bus,
        credentials: Credentials,
        settings: HttpSettings | None = None,
        *,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.bus = bus
        self.credentials = credentials
        self.settings = settings or HttpSettings()
        self._own_client = client is None
        self.client = client or httpx.AsyncClient(
            follow_redirects=False,
            trust_env=False,
            transport=_transport(public_only=not self.settings.allow_private_webhooks),
        )
        self.links: dict[str, WebhookLink] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Webhooks:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Attach every peer of the credentials that has a webhook.

        A peer whose roles the policy refuses is left out, with its ``auth_failed`` row and a
        warning; the others are attached.
        """
        for record in self.credentials.records():
            if record.webhook is None:
                continue
            try:
                await self.attach(record)
            except BusError as exc:
                logger.warning("webhook peer %s not attached: %s", record.client_id, exc)

    async def attach(self, record: PeerRecord) -> WebhookLink:
        """Put one webhook peer online (a peer added after the bus started, say).

        Raises:
            ValueError: ``record`` has no webhook.
            AuthenticationFailed: the policy refuses its roles; the row says why.
        """
        if record.webhook is None:
            raise ValueError(f"{record.client_id} has no webhook")
        self._check_address(record.client_id, record.webhook.url)
        link = WebhookLink(record.client_id, record.webhook, self)
        await self.bus.attach(link, record.client_id, record.roles, record.webhook.subscriptions)
        old = self.links.pop(record.client_id, None)
        if old is not None:
            self.bus.detach(old, "webhook")
        self.links[record.client_id] = link
        logger.info("webhook peer %s at %s", record.client_id, record.webhook.url)
        return link

    def _check_address(self, client_id: str, url: str) -> None:
        """Refuse a webhook at a loopback, private or link-local address
        (:mod:`bus.transports.egress`) unless ``allow_private_webhooks``.

        Raises:
            AuthenticationFailed: it is one; an ``auth_failed`` row (``private_webhook``) says so.
        """
        host = private_host(url)
        if host is None or self.settings.allow_private_webhooks:
            return
        self.bus.log.record(
            LogEvent.AUTH_FAILED, actor=client_id, status="private_webhook", error=host
        )
        raise AuthenticationFailed(
            f"the webhook of {client_id} is at {host}, not a public address: set "
            "http.allow_private_webhooks: true to allow it"
        )

    async def close(self) -> None:
        """Detach the webhook peers, wait for the failure reports, close the client."""
        for link in self.links.values():
            self.bus.detach(link, "webhook")
        self.links.clear()
        while self._tasks:
            await asyncio.wait(set(self._tasks))
        if self._own_client:
            await self.client.aclose()

    def spawn(self, coro: Any) -> asyncio.Task[None]:
        """Run ``coro`` as a task :meth:`close` waits for."""
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def failed(self, link: WebhookLink, params: Any, failure: WebhookFailed) -> None:
        """Log a delivery to ``link`` that failed for good and tell its sender."""
        payload = params.get("payload", {}) if isinstance(params, dict) else {}
        topic = params.get("topic") if isinstance(params, dict) else None
        message_id, sender = payload.get("messageId"), payload.get("from")
        with contextlib.suppress(BusError):
            self.bus.log.record(
                LogEvent.DELIVERY_FAILED,
                message_id=message_id,
                actor=link.client_id,
                topic=topic,
                status=failure.reason,
                error=failure.detail[:200],
                payload={"attempts": failure.attempts, "sender": sender},
            )
        logger.info("delivery of %s to %s failed: %s", message_id, link.client_id, failure)
        if sender == BUS_CLIENT_ID or not isinstance(sender, str) or not isinstance(topic, str):
            return
        status = DeliveryStatus(
            message_id=str(message_id),
            topic=topic,
            target=link.client_id,
            reason=failure.failure,
            attempts=failure.attempts,
            http_status=failure.answer_status if self._may_tell(link, sender) else None,
        )
        self.spawn(self._tell(sender, status))

    def _may_tell(self, link: WebhookLink, sender: str) -> bool:
        """Whether the webhook's own choices (its status number) may reach ``sender``: the
        taint rule from the webhook peer to the sender, refused when either is not online."""
        routes = {route.client_id: route for route in self.bus.routes()}
        target, to = routes.get(link.client_id), routes.get(sender)
        return target is not None and to is not None and may_flow(target.grants, to.grants)

    async def _tell(self, sender: str, status: DeliveryStatus) -> None:
        message_id = f"status-{uuid.uuid4().hex}"
        envelope = {
            "messageId": message_id,
            "type": DELIVERY_STATUS_TYPE,
            "from": BUS_CLIENT_ID,
            "timestamp": timestamp(),
            "correlationId": status.message_id,
            "content": status.model_dump(mode="json", by_alias=True),
        }
        try:
            await self.bus.publish(sender, envelope, message_id, DELIVERY_STATUS_TYPE, sender=None)
        except BusError:
            logger.exception("could not send delivery_status to %s", sender)


def _message_id(params: Any) -> str | None:
    if isinstance(params, dict) and isinstance(params.get("payload"), dict):
        value = params["payload"].get("messageId")
        return value if isinstance(value, str) else None
    return None


def _traceparent(params: Any) -> str | None:
    if isinstance(params, dict) and isinstance(params.get("payload"), dict):
        value = params["payload"].get("traceparent")
        return value if isinstance(value, str) else None
    return None


def _describe(exc: httpx.HTTPError) -> str:
    text = str(exc) or type(exc).__name__
    return _printable(f"{type(exc).__name__}: {text}")


def _printable(text: str) -> str:
    """``text`` cut to 200 characters, anything not printable as an escape: what the log row
    keeps of something a webhook wrote."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text[:200])


def _transport(*, public_only: bool) -> httpx.AsyncHTTPTransport:
    """httpx's own transport, connecting through :class:`PublicOnly` unless
    ``public_only`` is false."""
    transport = httpx.AsyncHTTPTransport(
        trust_env=False, limits=httpx.Limits(max_connections=100, max_keepalive_connections=20)
    )
    if public_only:
        # httpx takes no network backend; its pool does. The egress tests fail if this moves.
        pool = transport._pool
        assert isinstance(pool, httpcore.AsyncConnectionPool)
        pool._network_backend = PublicOnly(pool._network_backend)
    return transport


class PublicOnly(httpcore.AsyncNetworkBackend):
    """An httpcore network backend that connects to public addresses only.

    It resolves the host itself, refuses if any address it resolves to is not public (a name
    with one private address among public ones could be steered to it), and connects to the
    first: the address checked is the address connected to. TLS still verifies the name.

    Args:
        inner: the backend that makes the connections (httpcore's default).
    """

    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Resolve ``host``, check every address, connect to the first.

        Raises:
            httpcore.ConnectError: it does not resolve, or resolves to a non-public address.
        """
        try:
            async with asyncio.timeout(timeout):
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, port, type=socket.SOCK_STREAM
                )
        except (OSError, TimeoutError) as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        addresses = [str(info[4][0]) for info in infos]
        reason = refusal(host, addresses)
        if reason is not None:
            raise httpcore.ConnectError(reason)
        return await self._inner.connect_tcp(
            addresses[0], port, timeout, local_address, socket_options
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Never: a webhook is a URL."""
        raise httpcore.ConnectError("webhooks are not called over Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)
