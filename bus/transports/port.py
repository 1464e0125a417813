"""What a transport needs of the bus: the one door every link (HTTP, webhooks, the next ones)
goes through, as a :class:`typing.Protocol`.

A transport imports this, never :mod:`bus.server`: the bus sits above its transports, which
only feed it requests and links. :class:`bus.server.Bus` is the implementation; a test may
pass anything with these members.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from ..core.policy import Grants
from ..core.protocol import Request
from ..core.router import Route
from ..log.activity import ActivityLog
from ..log.fetch import FetchFilter, FetchResult
from ..ops.config import Limits
from ..ops.credentials import Credentials
from ..ops.refusals import Refusals
from .connection import ByteBudget, Link

__all__ = ["BusPort"]


class BusPort(Protocol):
    """The bus as its transports see it."""

    log: ActivityLog
    limits: Limits
    credentials: Credentials
    server_id: str
    refusals: Refusals
    on_delivered: Callable[[str, float], None] | None

    @property
    def url(self) -> str: ...

    @property
    def methods(self) -> list[str]: ...

    @property
    def byte_budget(self) -> ByteBudget: ...

    def routes(self) -> Iterable[Route[Link]]: ...

    async def route_for_token(
        self, token: str | None, request: Request, *, address: str
    ) -> Route[Link]: ...

    async def handle(
        self,
        route: Route[Link],
        request: Request,
        *,
        accepted: Callable[[dict[str, Any]], None] | None = None,
    ) -> Any: ...

    async def record_error(self, actor: str, request: Request, exc: Any) -> None: ...

    async def fetch(
        self,
        grants: Grants,
        pattern: str,
        since_epoch: int,
        limit: int | None = None,
        *,
        only: FetchFilter | None = None,
        rpc_id: str | None = None,
    ) -> FetchResult: ...

    async def attach(
        self, link: Link, client_id: str, roles: Iterable[str], patterns: Iterable[str] = ()
    ) -> Route[Link]: ...

    def detach(self, link: Link, reason: str = "detached") -> None: ...

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
    ) -> int: ...
