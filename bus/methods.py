"""The JSON-RPC methods of an initialized peer, carried out: the shell around
:mod:`bus.core.requests`.

:class:`Methods` holds the method table the bus dispatches to (``subscribe`` ...
``listPeers``; ``initialize`` is the bus's own, since it joins a link). Each method parses its
params, asks the core what to do (:mod:`bus.core.requests`), and carries the actions out with
the bus's ``carry``; ``sendMessage`` then hands the message to the :class:`~bus.fanout.Fanout`
and ``fetchMessages`` to the :class:`~bus.readback.Readback`. Replies are the wire forms of
:mod:`schemas.bus` models.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from schemas.bus import FetchMessagesParams, ListPeersResult, PingResult, SendMessageResult
from schemas.common import timestamp

from .core import requests
from .core.actions import Action
from .core.delivery import Message
from .core.errors import BusError, MethodNotFound, NotInitialized, ShuttingDown
from .core.logevents import LogEvent
from .core.params import parse
from .core.protocol import Request
from .core.recent import RecentIds
from .core.router import Route, Router
from .core.state import PeerStates
from .fanout import Fanout
from .log.fetch import FetchResult
from .ops.config import Limits
from .transports.connection import Link
from .transports.websocket import Method, QuickMethod, link_facts

if TYPE_CHECKING:
    from .core.policy import Grants

__all__ = ["Accepted", "Methods", "Quick", "rpc_id_of"]

Accepted = Callable[[dict[str, Any]], None]
"""Told ``{messageId, epoch}`` once a message is accepted, before it is delivered."""

Fetch = Callable[..., Awaitable[FetchResult]]


class Quick:
    """A method that never waits: a socket's read loop calls :attr:`run` and answers at once,
    without a task; awaited, it is a :data:`Method` like the others (HTTP, webhooks).

    Args:
        run: the method's body; returns the result or raises its :class:`BusError`.
    """

    __slots__ = ("run",)

    def __init__(self, run: QuickMethod) -> None:
        self.run = run

    async def __call__(self, route: Route[Link], request: Request) -> Any:
        return self.run(route, request)


class Methods:
    """The methods a peer may call once initialized, for one bus.

    Args:
        carry: carries out a core decision's actions and returns its reply (the bus's).
        fetch: reads messages back (:meth:`bus.server.Bus.fetch`).
        closing: tells whether the bus is closing (every request is then refused -32007).
    """

    def __init__(
        self,
        router: Router[Link],
        states: PeerStates[Link],
        limits: Limits,
        fanout: Fanout,
        *,
        carry: Callable[[list[Action]], Any],
        fetch: Fetch,
        closing: Callable[[], bool],
    ) -> None:
        self._log = fanout.log
        self._closing = closing
        self._router = router
        self._states = states
        self._limits = limits
        self._fanout = fanout
        self._carry = carry
        self._fetch = fetch
        window = limits.dedup_window
        self.recent = (
            None if window is None else RecentIds(window=window, max_ids=limits.dedup_max_ids)
        )
        """The messageIds seen lately, per sender (``dedup_window``), or None."""
        self.table: dict[str, Method] = {
            "subscribe": Quick(self._subscribe),
            "unsubscribe": Quick(self._unsubscribe),
            "sendMessage": self.send_message,
            "fetchMessages": self._fetch_messages,
            "listSubscriptions": Quick(self._list_subscriptions),
            "ping": Quick(self._ping),
            "listPeers": self._list_peers,
        }
        """By name; a test may replace one. The :class:`Quick` ones never wait."""

    async def handle(
        self, route: Route[Link], request: Request, *, accepted: Accepted | None = None
    ) -> Any:
        """Carry out ``request`` for ``route``'s peer as if it came on its socket: the same
        checks, limits and rows; an error answer gets its ``rpc_error`` row. How requests from
        peers not on a socket (HTTP, webhooks) are carried out.

        Args:
            accepted: for ``sendMessage``, called with ``{messageId, epoch}`` once the message
                is accepted (authorized, its rows committed) and before it is delivered, so a
                caller can answer at once and let delivery go on.

        Raises:
            BusError: the JSON-RPC error to answer with.
        """
        try:
            if self._closing():
                raise ShuttingDown()
            if request.method == "sendMessage":
                return await self.send_message(route, request, accepted)
            method = self.method(request.method)
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

    async def record_error(self, actor: str, request: Request, exc: BusError) -> None:
        """Log the ``rpc_error`` row of an error answer and commit it, before the peer reads
        the answer. :meth:`handle` does it for what it answers; a transport calls it for the
        errors it answers on its own (a malformed HTTP body)."""
        log = self._log
        with contextlib.suppress(BusError):
            # A log that refuses the row (closed, or its backlog full: AuditUnavailable) must
            # not cost the peer its answer: the error still goes, without its row.
            log.record(
                LogEvent.RPC_ERROR,
                rpc_id=rpc_id_of(request),
                actor=actor,
                status=str(exc.code),
                payload={"method": request.method[:64]},
                error=exc.message,
            )
            await log.commit()

    def __iter__(self) -> Iterator[str]:
        return iter(self.table)

    def quick_method(self, name: str) -> QuickMethod | None:
        """The body of the method called ``name`` if it never waits (:class:`Quick`), else
        None: call :meth:`method` then, and await it."""
        method = self.table.get(name)
        return method.run if isinstance(method, Quick) else None

    def method(self, name: str) -> Method:
        """The method called ``name``.

        Raises:
            MethodNotFound: there is none.
        """
        method = self.table.get(name)
        if method is None:
            raise MethodNotFound(f"Method not found: {name[:64]!r}")
        return method

    def _subscribe(self, route: Route[Link], request: Request) -> Any:
        limit = self._limits.max_subscriptions
        rpc_id = rpc_id_of(request)
        actions = requests.subscribe(
            self._router, route, request.params, rpc_id=rpc_id, max_subscriptions=limit
        )
        return self._carry(actions)

    def _list_subscriptions(self, route: Route[Link], request: Request) -> Any:
        return self._carry(requests.list_subscriptions(route))

    def _unsubscribe(self, route: Route[Link], request: Request) -> Any:
        rpc_id = rpc_id_of(request)
        return self._carry(requests.unsubscribe(self._router, route, request.params, rpc_id=rpc_id))

    def _ping(self, route: Route[Link], request: Request) -> Any:
        return PingResult.frame(timestamp())

    async def _list_peers(self, route: Route[Link], request: Request) -> Any:
        self._carry(requests.admit_admin(route, rpc_id_of(request), request.method))
        result = self.local_peers()
        cluster = self._fanout.cluster
        if cluster is not None:  # and every other node's
            result = await cluster.list_peers(result)
        return result.model_dump(by_alias=True)

    def local_peers(self) -> ListPeersResult:
        """The ``listPeers`` result of this node alone (the cluster link asks for it)."""
        since = {link: state.since for link, state in self._states.items()}
        routes = self._router.routes()
        return requests.peer_list(routes, since, link_facts, now=timestamp())

    async def _fetch_messages(self, route: Route[Link], request: Request) -> Any:
        params = parse(FetchMessagesParams, request.params)
        grants: Grants = route.grants
        result = await self._fetch(
            grants, params.topic, params.since_epoch, params.limit, rpc_id=rpc_id_of(request)
        )
        return result.to_wire()

    async def send_message(
        self, route: Route[Link], request: Request, accepted: Accepted | None = None
    ) -> Any:
        """``sendMessage``: admit it (sender, type, duplicate), accept it (its epoch and rows,
        committed), tell ``accepted``, deliver it, and answer how many processed it."""
        rpc_id, recent = rpc_id_of(request), self.recent
        now = asyncio.get_running_loop().time() if recent is not None else 0.0
        admission = requests.admit_send(
            route, request.params, rpc_id=rpc_id, recent=recent, now=now
        )
        fields, topic = admission.fields, admission.topic
        if fields is None:
            return self._carry(admission.actions)
        assert isinstance(request.params, dict)  # validated as an object above
        message_id = fields.message_id
        message = Message(
            topic,
            # Taken out of the request: the message holds the one copy, encoded once it is
            # logged, while the request waits for its deliveries.
            request.params.pop("payload"),
            message_id,
            fields.type,
            trace_id=fields.trace_id,
            relevance=fields.relevance,
        )
        fanout = self._fanout
        try:
            if fanout.cluster is not None:  # cut off from the other nodes: refuse, never
                fanout.cluster.check()  # half-deliver (-32011)
            targets = await fanout.accept(message, sender=route, rpc_id=rpc_id)
        except BusError:
            if recent is not None:
                recent.release((route.client_id, message_id))  # nothing delivered: may retry
            raise
        if accepted is not None:
            accepted({"messageId": message_id, "epoch": message.epoch})
        delivered = await fanout.fan_out(
            targets, message, actor=route.client_id, rpc_id=rpc_id, hearer=route.grants
        )
        return SendMessageResult.frame(message_id, delivered, message.epoch)


def rpc_id_of(request: Request) -> str | None:
    """A request's id as the log's ``rpc_id`` column keeps it."""
    return None if request.id is None else str(request.id)
