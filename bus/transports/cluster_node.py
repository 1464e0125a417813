"""What the cluster link and the bus it joins ask of each other, and a sender's grants there.

:class:`Node` is the bus as the link sees it (:class:`bus.server.Bus`); :class:`Forwarder` is
the link as the bus sees it (``Bus.cluster``). Both are protocols so that the link can be
tested against a stand-in bus, and the bus against stand-in nodes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from schemas.bus import ListPeersResult

from ..core.epochs import Epochs
from ..core.identities import PeerIdentity
from ..core.policy import Grants, Policy, PolicyError
from ..core.router import Route
from ..log.activity import ActivityLog
from ..ops.config import Limits
from ..ops.credentials import Credentials

__all__ = ["Accepted", "Forwarder", "Node", "Trigger", "grants_of"]

T = TypeVar("T")


class Accepted(Protocol):
    """What :meth:`Forwarder.forward` reads of a message the bus accepted."""

    topic: str
    message_id: str
    type: str
    epoch: int
    trace_id: str | None

    @property
    def payload(self) -> dict[str, Any]:
        """The envelope, decoded for this use (the bus holds it encoded)."""
        ...


class Node(Protocol):
    """What the cluster link needs of the bus it joins (:class:`bus.server.Bus`)."""

    log: ActivityLog
    limits: Limits
    credentials: Credentials
    policy: Policy
    identities: dict[str, PeerIdentity]
    cluster: Forwarder | None

    @property
    def peers(self) -> Mapping[str, Any]: ...

    @property
    def epochs(self) -> Epochs:
        """The bus's epochs: the link makes them follow the cluster's stream."""

    def deliver_forwarded(
        self,
        topic: str,
        payload: dict[str, Any],
        message_id: str,
        message_type: str,
        *,
        sender: Route[Any] | None,
        epoch: int,
        trace_id: str | None = None,
    ) -> Awaitable[tuple[int, int]]: ...

    def replaced_elsewhere(self, client_id: str, node: str) -> bool: ...

    def local_peers(self) -> ListPeersResult: ...


class Trigger(Protocol):
    """What a node's reloads need of its :class:`bus.ops.reload.Reloader`."""

    def trigger(self) -> None: ...


class Forwarder(Protocol):
    """What the bus asks of the other nodes (:attr:`bus.server.Bus.cluster`)."""

    def check(self) -> None:
        """Raise :class:`ClusterUnavailable` when the other nodes cannot be reached."""

    def joined(self, client_id: str) -> None:
        """Tell the other nodes that ``client_id`` logged in here (they close older links)."""

    async def sequence(self, message: Accepted, sender: str, stamp: Callable[[int], T]) -> T:
        """Store ``message`` in the cluster's stream, and return what ``stamp`` returns once
        this node reads it back there: ``stamp`` is called with its epoch, in the stream's
        order, and must not wait (it records the message's rows).

        Raises:
            ClusterUnavailable: the stream could not be reached; ``stamp`` was not called.
        """

    def forget(self, message: Accepted) -> None:
        """``message`` (sequenced) is not delivered here after all: await no answers for it."""

    async def forward(self, message: Accepted, sender: str) -> tuple[int, int]:
        """Gather the other nodes' answers to ``message`` (sequenced); return (processed,
        tried) over them."""

    async def list_peers(self, local: ListPeersResult) -> ListPeersResult:
        """``local`` with the peers of every other node that answers."""


def grants_of(bus: Node, client_id: str) -> Grants | None:
    """The grants ``bus``'s policy gives ``client_id``; None if it has no credential there or
    the policy refuses its roles."""
    record = bus.credentials.record(client_id)
    if record is None:
        return None
    identity = bus.identities.get(client_id)
    extra: Iterable[str] = identity.roles if identity is not None else ()
    try:
        roles = bus.policy.roles_for(client_id, (*record.roles, *extra))
        taint = identity.taint if identity is not None else None
        return bus.policy.grants(client_id, roles, taint=taint)
    except (PolicyError, ValueError):
        return None
