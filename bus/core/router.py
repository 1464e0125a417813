"""The routing table: which connection is which clientId, what it may do, what it subscribes to,
and who gets a message on a topic. Pure: no sockets, no awaits, no clock.

Each fact has one home here. The bus asks the router and tells it what happened; it never keeps
a second copy of a subscription on the connection, so the two can't drift apart::

    router: Router[Connection] = Router()
    replaced = router.join(conn, "agent:w1", grants)    # a takeover returns the old handle
    router.subscribe(conn, "agent:*")
    for route in router.targets("agent:w2", sender=other):
        ...                                              # route.handle, route.grants
    router.leave(conn)                                   # None if it was replaced meanwhile

A handle is anything hashable that stands for one connection (the bus uses its
:class:`~bus.transports.connection.Connection` objects; the tests use strings).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from typing import Generic, TypeVar

from .policy import Grants
from .pushes import PLAIN, PushOptions
from .topics import SubscriptionIndex, matches

__all__ = ["Route", "Router"]

K = TypeVar("K", bound=Hashable)


class Route(Generic[K]):
    """One authenticated peer: its connection, clientId, grants and subscription patterns.

    Equal only to itself, as a connection's handle is.
    """

    # A plain class rather than a dataclass: mypyc cannot compile a generic dataclass
    # (mypyc/mypyc#827), and the compiled build (setup.py) compiles this module.
    __slots__ = ("client_id", "credential", "grants", "handle", "options", "patterns")

    def __init__(
        self,
        handle: K,
        client_id: str,
        grants: Grants,
        patterns: set[str] | None = None,
        options: dict[str, PushOptions] | None = None,
        credential: str | None = None,
    ) -> None:
        self.handle = handle
        self.client_id = client_id
        self.grants = grants
        self.patterns: set[str] = set() if patterns is None else patterns
        self.options: dict[str, PushOptions] = {} if options is None else options
        """The push options of the patterns that have any (``debounceMs``, ``minRelevance``);
        empty for a peer that wants every message, so delivery checks nothing more for it."""
        self.credential = credential
        """The token hash it authenticated with: a reload that changes it closes the peer."""

    def __repr__(self) -> str:
        return f"Route(handle={self.handle!r}, client_id={self.client_id!r})"

    def options_for(self, topic: str) -> list[PushOptions]:
        """The options of each of this peer's patterns that match ``topic``."""
        return [self.options.get(p, PLAIN) for p in self.patterns if matches(p, topic)]


class Router(Generic[K]):
    """Authenticated peers and their subscriptions, indexed for delivery."""

    def __init__(self) -> None:
        self._routes: dict[K, Route[K]] = {}
        self._by_id: dict[str, Route[K]] = {}
        self._index: SubscriptionIndex[K] = SubscriptionIndex()

    def __len__(self) -> int:
        """The number of authenticated peers."""
        return len(self._by_id)

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._by_id

    @property
    def peers(self) -> Mapping[str, K]:
        """clientId -> handle of every authenticated peer (a fresh read-only copy)."""
        return {client_id: route.handle for client_id, route in self._by_id.items()}

    def route(self, handle: K) -> Route[K] | None:
        """The route of ``handle``; None before it joined, after it left or was replaced."""
        return self._routes.get(handle)

    def route_of(self, client_id: str) -> Route[K] | None:
        """The route of the peer authenticated as ``client_id``; None if it has none."""
        return self._by_id.get(client_id)

    def routes(self) -> Iterator[Route[K]]:
        """Every authenticated peer's route."""
        return iter(self._by_id.values())

    # Membership

    def join(
        self, handle: K, client_id: str, grants: Grants, *, credential: str | None = None
    ) -> K | None:
        """Register ``handle`` as ``client_id``; return the handle it takes over, if any.

        The replaced handle is forgotten with all its subscriptions: close it, and expect
        :meth:`leave` to return None for it later.
        """
        old = self._by_id.get(client_id)
        if old is not None:
            self._drop(old)
        route = Route(handle, client_id, grants, credential=credential)
        self._routes[handle] = route
        self._by_id[client_id] = route
        return old.handle if old is not None else None

    def leave(self, handle: K) -> Route[K] | None:
        """Forget ``handle``; return its route, or None if it never joined or was replaced."""
        route = self._routes.get(handle)
        if route is not None:
            self._drop(route)
        return route

    def _drop(self, route: Route[K]) -> None:
        for pattern in route.patterns:
            self._index.discard(pattern, route.handle)
        route.patterns.clear()
        route.options.clear()
        del self._routes[route.handle]
        del self._by_id[route.client_id]  # join() drops the old route before adding a new one

    # Subscriptions

    def subscribe(self, handle: K, pattern: str, options: PushOptions = PLAIN) -> bool:
        """Add ``pattern`` to ``handle``'s subscriptions with ``options``; False if it already
        had it (its options are replaced).

        Raises:
            KeyError: ``handle`` has not joined.
        """
        route = self._routes[handle]
        if options.plain:
            route.options.pop(pattern, None)
        else:
            route.options[pattern] = options
        if pattern in route.patterns:
            return False
        route.patterns.add(pattern)
        self._index.add(pattern, handle)
        return True

    def unsubscribe(self, handle: K, pattern: str) -> bool:
        """Remove ``pattern`` from ``handle``'s subscriptions; False if it did not have it."""
        route = self._routes.get(handle)
        if route is None or pattern not in route.patterns:
            return False
        route.patterns.discard(pattern)
        route.options.pop(pattern, None)
        self._index.discard(pattern, handle)
        return True

    # Delivery

    def targets(self, topic: str, *, sender: K | None = None) -> list[Route[K]]:
        """The peers with a pattern matching ``topic``, each once, never the sender."""
        routes = self._routes
        return [routes[handle] for handle in self._index.match(topic) if handle is not sender]
