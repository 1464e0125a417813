"""Who is on the bus: peers joining and leaving over any link, and a new configuration put in
force on those already there; the shell around :mod:`bus.core.joins`.

:class:`Members` carries out what :mod:`bus.core.joins` decides for each way in: a socket's
``initialize`` (:meth:`Members.join`), a webhook peer attached (:meth:`Members.attach`), a
request over HTTP from a peer that may not be online (:meth:`Members.route_for_token`), a link
closing (:meth:`Members.leave`), a login on another cluster node
(:meth:`Members.replaced_elsewhere`) and a reload (:meth:`Members.reconfigure`). It reads the
configuration from the bus each time (a reload replaces it), through :class:`Configured`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol

from schemas.bus import InitializeParams
from schemas.common import timestamp

from . import __version__
from .core import joins
from .core.actions import Action
from .core.epochs import Epochs
from .core.errors import AuthenticationFailed, BusError, ShuttingDown
from .core.identities import PeerIdentity
from .core.logevents import LogEvent
from .core.params import parse
from .core.policy import Policy
from .core.protocol import Request
from .core.router import Route, Router
from .core.state import PeerStates
from .log.activity import ActivityLog
from .methods import rpc_id_of
from .ops.config import Limits
from .ops.credentials import Credentials
from .ops.rights import Regrant, Revoke, review
from .transports.connection import Connection, Link, PeerGone

__all__ = ["Configured", "Members"]

logger = logging.getLogger("bus.members")


class Configured(Protocol):
    """The configuration a join is decided by, as the bus holds it now."""

    policy: Policy
    credentials: Credentials
    identities: dict[str, PeerIdentity]
    limits: Limits
    server_id: str
    log: ActivityLog


Handle = Callable[[Route[Link], Request], Coroutine[Any, Any, Any]]


class Members:
    """Joins and leaves for one bus.

    Args:
        config: the bus, read at each join (a reload changes it).
        carry: carries out a core decision's actions (the bus's).
        joined_elsewhere: told each clientId that joined here (on a cluster node, an older link
            of it on another node then closes).
        handle: carries out a request for a route (:meth:`bus.methods.Methods.handle`): how an
            attached peer is subscribed.
        closing: tells whether the bus is closing.
    """

    def __init__(
        self,
        config: Configured,
        router: Router[Link],
        states: PeerStates[Link],
        epochs: Epochs,
        *,
        carry: Callable[[list[Action]], Any],
        joined_elsewhere: Callable[[str], None],
        handle: Handle,
        closing: Callable[[], bool],
    ) -> None:
        self._config = config
        self._handle = handle
        self._closing = closing
        self._router = router
        self._states = states
        self._epochs = epochs
        self._carry = carry
        self._joined_elsewhere = joined_elsewhere

    def rules(self) -> joins.Rules:
        """What a join is decided by, as configured now (a reload changes it)."""
        config = self._config
        return joins.Rules(
            config.policy,
            config.identities,
            config.limits.max_connections,
            config.server_id,
            __version__,
        )

    async def join(
        self, link: Link, request: Request, *, address: str, remote: str, bearer: str | None
    ) -> tuple[str, Any]:
        """Carry out ``initialize`` for a link that came in on its own (a socket): its
        credential, the policy, a takeover, the rows and presence
        (:func:`bus.core.joins.initialize`). Return the clientId and the result's wire form.

        Raises:
            BusError: the refusal to answer with (its row is recorded).
        """
        params = parse(InitializeParams, request.params)
        client_id = params.client_id
        token = params.auth.token if params.auth is not None else bearer
        ask = joins.Ask(client_id, rpc_id_of(request), address, token is not None, remote)
        record = self._config.credentials.verify(client_id, token)
        credential = None if record is None else joins.Credential(record.roles, record.token_hash)
        actions = joins.initialize(
            self._router,
            link,
            credential,
            ask,
            self.rules(),
            attached=lambda other: not isinstance(other, Connection),
            epoch=self._epochs.last,
        )
        result = self._carry(actions)
        self._states.open(link).joined(timestamp())
        self._joined_elsewhere(client_id)
        return client_id, result

    def leave(self, link: Link, reason: str = "detached") -> None:
        """Forget ``link``: its timers, its route and subscriptions; a joined peer's
        ``disconnect`` row and presence (``reason`` is the close code)."""
        for timer in self._states.close(link):
            timer.cancel()
        self._carry(joins.leave(self._router, link, reason))

    async def attach(
        self,
        link: Link,
        client_id: str,
        roles: Iterable[str],
        patterns: Iterable[str] = (),
    ) -> Route[Link]:
        """Join a peer the bus reaches through ``link`` rather than a socket (a webhook).

        It is authorized, subscribed to its own clientId and to ``patterns``, logged and
        announced as a WebSocket peer's ``initialize`` is; a pattern the policy refuses is
        left out, with its rows. Call :meth:`leave` (the bus's ``detach``) when it leaves.

        Raises:
            AuthenticationFailed: the policy refuses its roles; the row says why.
        """
        rules = self.rules()
        self._carry(joins.attach(self._router, link, client_id, roles, rules, name=link.name))
        route = self._router.route(link)
        assert route is not None  # else carry raised the refusal
        self._states.open(link).joined(timestamp())
        for pattern in patterns:
            request = Request(None, "subscribe", {"topic": pattern})
            try:
                await self._handle(route, request)
            except BusError as exc:
                logger.warning("%s: not subscribed to %r: %s", client_id, pattern, exc)
        return route

    async def route_for_token(
        self, token: str | None, request: Request, *, address: str
    ) -> Route[Link]:
        """The route a request that arrived without a socket (HTTP) acts through.

        The peer is the one ``token`` belongs to (the same credentials as ``initialize``). If it
        is online (a socket or a webhook) its route is returned, so it never gets its own
        messages; otherwise a route of its own kind that nothing is delivered to, with the
        grants the policy gives it now. Pass the route to the bus's ``handle``.

        Raises:
            AuthenticationFailed: no peer has this token, or the policy refuses its roles; the
                row is logged (``actor`` is ``address``) and committed first.
            ShuttingDown: the bus is closing.
        """
        if self._closing():
            raise ShuttingDown()
        config = self._config
        record = config.credentials.identify(token)
        if record is None:
            config.log.record(
                LogEvent.AUTH_FAILED,
                rpc_id=rpc_id_of(request),
                actor=address,
                status="refused",
                error="unknown token" if token else "no credential",
            )
            with contextlib.suppress(BusError):
                await config.log.commit()
            raise AuthenticationFailed(
                "Authentication failed: send Authorization: Bearer with the token "
                "`bcpbus peers add` printed"
            )
        route = self._router.route_of(record.client_id)
        if route is not None:
            return route
        rpc_id = rpc_id_of(request)
        granted = joins.grant(self.rules(), record.client_id, record.roles, rpc_id=rpc_id)
        self._carry(granted.actions)
        assert granted.grants is not None  # else carry raised its error
        return Route(_Detached(record.client_id), record.client_id, granted.grants)

    def replaced_elsewhere(self, client_id: str, node: str) -> bool:
        """Close (4001) ``client_id``'s link here: it connected again on ``node``. Nothing is
        announced: the newer connection's node announces it. Return whether it was here."""
        actions = joins.replaced_elsewhere(self._router, client_id, node)
        self._carry(actions)
        return bool(actions)

    def review(self) -> tuple[int, int]:
        """Review every joined peer under the configuration the bus holds now (see
        :meth:`bus.server.Bus.reconfigure`); return how many were closed and how many
        subscriptions were dropped."""
        config = self._config
        routes = list(self._router.routes())
        revoked = dropped = 0
        for change in review(routes, config.credentials, config.policy, config.identities):
            match change:
                case Revoke(route=route, reason=reason, detail=detail):
                    self._carry(joins.revoke(self._router, route, reason, detail))
                    revoked += 1
                case Regrant(route=route, grants=grants):
                    self._carry(joins.regrant(self._router, route, grants, change.dropped))
                    dropped += len(change.dropped)
        return revoked, dropped


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
