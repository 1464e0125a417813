"""Who gets a message, decided with no awaits: the taint rule, ``minRelevance`` and
``debounceMs`` per target, and what a debounce window pushes when it ends.

:func:`targets` takes a message that has its epoch and returns the rows to record for the
peers left out (``taint_refused``, ``push_skipped``), the timers to set for messages a window
holds, and the routes to deliver to, each of which gets a ``process_start`` row (the shell
writes those itself: one row per delivery is the hot path, and a :class:`Record` each costs);
:func:`flush` says what a window's timer pushes when it fires. The shell records, commits
(nothing is delivered before its rows are durable), sets the timers and calls
``processMessage``::

    picked = targets(router, states, message, sender=route, clock=loop.time)
    for row in picked.rows: ...            # log.record
    for timer in picked.timers: ...        # loop.call_at
    for target in picked.routes: ...       # a process_start row; deliver after the commit
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from . import _json
from .actions import Record
from .logevents import LogEvent
from .policy import RAW_TEXT_TYPES, Grants, may_flow
from .pushes import push_window
from .router import Route, Router
from .state import PeerStates

__all__ = ["Message", "Picked", "SetTimer", "flush", "outcome", "targets", "unheard"]

K = TypeVar("K", bound=Hashable)


@dataclass(slots=True)
class Message:
    """One message on its way through the bus: what it is, and the epoch it was given.

    Its envelope is held once: decoded (``decoded``, as it arrived) until :meth:`encode` is
    called, then as the compact JSON that its ``send_start`` row and every frame carrying it
    reuse (``encoded``). :attr:`payload` decodes that again for the few readers that need a
    dict, for as long as they use it.
    """

    topic: str
    decoded: dict[str, Any] | None
    message_id: str
    type: str
    trace_id: str | None = None
    relevance: float | None = None
    epoch: int = 0
    """Given when the bus accepts it; 0 until then."""
    aborted: bool = False
    """Its rows could not be committed: it was refused (-32006), and is never pushed later."""
    forwarded: bool = False
    """Another bus node of a cluster accepted it: delivered here, never forwarded again."""
    encoded: str | bytes | None = None
    """The envelope as compact JSON once :meth:`encode` was called: text when it is ASCII (the
    log's row is then the same object), else UTF-8 bytes (a text would also cache its UTF-8
    form each time it is written, a second copy)."""

    @property
    def payload(self) -> dict[str, Any]:
        """The envelope as a dict: the one that arrived, or a fresh decoding of ``encoded``
        (do not keep it: a copy held is a copy more in memory)."""
        if self.decoded is not None:
            return self.decoded
        assert self.encoded is not None  # one of the two is always set
        payload: dict[str, Any] = _json.loads(self.encoded)
        return payload

    def encode(self) -> str | bytes:
        """Encode the envelope once, drop the decoded copy, and return :attr:`encoded`."""
        if self.encoded is None:
            assert self.decoded is not None
            data = _json.dumpb(self.decoded)
            self.encoded = data.decode() if data.isascii() else data
            self.decoded = None
        return self.encoded

    def text(self) -> str:
        """The envelope as JSON text: :attr:`encoded` itself when it is ASCII."""
        encoded = self.encode()
        return encoded if isinstance(encoded, str) else encoded.decode()

    def row(self, event: LogEvent, actor: str, status: str | None = None) -> Record:
        """A row about this message and one target."""
        return Record(
            event,
            actor=actor,
            message_id=self.message_id,
            topic=self.topic,
            status=status,
            epoch=self.epoch,
            trace_id=self.trace_id,
        )


@dataclass(frozen=True, slots=True)
class SetTimer(Generic[K]):
    """At ``at`` (the loop's clock), call :func:`flush` for ``link`` and ``topic``, and keep
    the timer in the link's :class:`~bus.core.state.PeerState` so that it can be cancelled."""

    link: K
    topic: str
    at: float


class Picked(NamedTuple, Generic[K]):
    """What :func:`targets` decided."""

    rows: list[Record]
    timers: list[SetTimer[K]]
    routes: list[Route[K]]


def targets(
    router: Router[K],
    states: PeerStates[K],
    message: Message,
    *,
    sender: Route[K] | None,
    clock: Callable[[], float],
) -> Picked[K]:
    """The peers ``message`` goes to now (each gets a ``process_start`` row from the shell);
    those the taint rule refuses, or whose subscriptions hold it back, get their row here.

    Args:
        sender: the sending peer's route (never a target), or None for the bus itself.
        clock: read only when a debounce window decides.
    """
    grants = sender.grants if sender is not None else None
    rows: list[Record] = []
    timers: list[SetTimer[K]] = []
    routes: list[Route[K]] = []
    for target in router.targets(message.topic, sender=sender.handle if sender else None):
        if grants is not None and not may_flow(grants, target.grants, message.type):
            # A reader's raw text is "high" whoever carries it (policy.RAW_TEXT_TYPES).
            level = "high" if message.type in RAW_TEXT_TYPES else grants.taint
            status = f"{level}->{target.grants.taint}"
            rows.append(message.row(LogEvent.TAINT_REFUSED, target.client_id, status))
            continue
        if target.options:
            skipped = _hold_back(states, target, message, clock, timers)
            if skipped is not None:
                rows.append(message.row(LogEvent.PUSH_SKIPPED, target.client_id, skipped))
                continue
        routes.append(target)
    return Picked(rows, timers, routes)


def _hold_back(
    states: PeerStates[K],
    route: Route[K],
    message: Message,
    clock: Callable[[], float],
    timers: list[SetTimer[K]],
) -> str | None:
    """Why ``route``'s subscriptions do not want ``message`` pushed now (``min_relevance`` or
    ``debounce``), or None to push it. A message held for the end of a window may need a
    timer: it is appended to ``timers``."""
    topic = message.topic
    window = push_window(route.options_for(topic), message.relevance)
    if window is None:
        return "min_relevance"
    if window == 0:
        return None
    offer = states.open(route.handle).debounce.offer(topic, message, window / 1000, clock())
    if offer.push:
        return None
    if offer.flush_at is not None:
        timers.append(SetTimer(route.handle, topic, offer.flush_at))
    return "debounce"


def flush(
    router: Router[K], states: PeerStates[K], link: K, topic: str, now: float
) -> tuple[Route[K], Message, int] | None:
    """At the end of ``link``'s debounce window on ``topic``: the route to push to, the latest
    message held and how many it replaced (``skipped``); None if nothing is to be pushed (the
    link left, nothing is held, the message was refused with -32006, or no subscription of
    the peer matches any more)."""
    state = states.get(link)
    if state is None:
        return None
    state.timers.pop(topic, None)
    due = state.debounce.due(topic, now)
    route = router.route(link)
    if due is None or route is None:
        return None
    message, skipped = due
    if message.aborted or not route.options_for(topic):
        return None
    return route, message, skipped


def outcome(result: Any) -> tuple[str, str | None]:
    """A ``processMessage`` answer as the ``process_finish`` row's status and error:
    ``processed``, or ``not_processed`` with the peer's status and message (200 characters at
    most: a peer's text is not the log's to keep at length)."""
    if isinstance(result, dict) and result.get("processed") is True:
        return "processed", None
    if isinstance(result, dict):
        return "not_processed", f"{result.get('status', '')}: {result.get('message', '')}"[:200]
    return "not_processed", "malformed processMessage result"


def unheard(routes: list[Route[K]], sender: Grants | None) -> tuple[list[Route[K]], list[Route[K]]]:
    """Split ``routes`` into the targets whose answers the sender may hear, and those it may
    not: a target more tainted than the sender (a reader, for a controller that writes to its
    inbox) would otherwise choose the sender's ``deliveredTo`` and how long its request takes,
    a channel from tainted to untainted outside the gateway. Those are delivered to without the
    sender waiting or counting them (their ``process_finish`` rows say how they went).

    The bus itself (``sender`` None) hears everyone, and so does and is heard by the
    declassifier, as the taint rule has it (:func:`bus.core.policy.may_flow`).
    """
    if sender is None:
        return routes, []
    heard: list[Route[K]] = []
    unheard_: list[Route[K]] = []
    for route in routes:
        (heard if may_flow(route.grants, sender) else unheard_).append(route)
    return heard, unheard_
