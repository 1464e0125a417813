"""The bus's decisions on one peer's requests: subscriptions, admin calls, what it may send.

Each function takes the request's params and what the decision depends on (the peer's route,
the routing table, the limits, the clock's reading) and returns the actions to carry out
(:mod:`bus.core.actions`): the rows to record, then a :class:`Reply` or a :class:`Fail`.
Nothing here awaits or raises into the shell; a malformed request becomes a :class:`Fail`.
The routing table is pure state, so a decision that changes it (a subscription) changes it
here, with no await between the check and the change::

    for action in subscribe(router, route, request.params, rpc_id="7", max_subscriptions=64):
        ...                                    # Record -> log.record, Reply -> the answer
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, NamedTuple, TypeVar

from schemas.bus import (
    ListPeersResult,
    ListSubscriptionsResult,
    SubscribeParams,
    SubscribeResult,
    SubscriptionInfo,
    UnsubscribeParams,
)

from .actions import Action, Fail, Record, Reply
from .errors import (
    BusError,
    ContentNotKept,
    DuplicateMessage,
    Forbidden,
    LimitExceeded,
    SubscriptionNotFound,
)
from .logevents import LogEvent
from .params import SendFields, parse, read_send_message
from .policy import Grants
from .pushes import PLAIN, PushOptions
from .recent import RecentIds
from .router import Route, Router
from .topics import validate_pattern, validate_topic

__all__ = [
    "Admission",
    "LinkFacts",
    "FetchAdmission",
    "admit_admin",
    "admit_fetch",
    "admit_send",
    "list_peers",
    "list_subscriptions",
    "peer_list",
    "refusal",
    "subscribe",
    "unsubscribe",
]

K = TypeVar("K", bound=Hashable)

logger = logging.getLogger("bus.server")


def refusal(
    route: Route[Any],
    rpc_id: str | None,
    method: str,
    reason: str,
    *,
    topic: str | None = None,
    message_id: str | None = None,
) -> Record:
    """The ``refused`` row of a request the policy or a rule turned down (logged at INFO)."""
    logger.info("refused %s from %s: %s", method, route.client_id, reason)
    return Record(
        LogEvent.REFUSED,
        actor=route.client_id,
        rpc_id=rpc_id,
        message_id=message_id,
        topic=topic,
        status=reason,
    )


def subscribe(
    router: Router[K],
    route: Route[K],
    params: Any,
    *,
    rpc_id: str | None,
    max_subscriptions: int | None,
) -> list[Action]:
    """``subscribe``: add a pattern (or change its options) if the policy and the limit allow.

    Subscribing again with the same options changes nothing and writes no row.
    """
    try:
        model = parse(SubscribeParams, params)
        pattern = validate_pattern(model.topic)
    except BusError as exc:
        return [Fail(exc)]
    if not route.grants.may_subscribe(pattern):
        denied = Forbidden(f"{route.client_id} may not subscribe to {pattern!r}")
        return [
            refusal(route, rpc_id, "subscribe", "subscribe_denied", topic=pattern),
            Fail(denied),
        ]
    options = PushOptions(model.debounce_ms, model.min_relevance)
    if pattern not in route.patterns:
        if max_subscriptions is not None and len(route.patterns) >= max_subscriptions:
            return _too_many_subscriptions(route, rpc_id, pattern, max_subscriptions)
    elif route.options.get(pattern, PLAIN) == options:
        return [Reply(SubscribeResult())]
    router.subscribe(route.handle, pattern, options)
    payload = (
        None
        if options.plain
        else {"debounceMs": options.debounce_ms, "minRelevance": options.min_relevance}
    )
    row = Record(
        LogEvent.SUBSCRIBE, actor=route.client_id, rpc_id=rpc_id, topic=pattern, payload=payload
    )
    return [row, Reply(SubscribeResult())]


def _too_many_subscriptions(
    route: Route[K], rpc_id: str | None, pattern: str, limit: int
) -> list[Action]:
    """A new pattern past ``max_subscriptions``: its row and -32005."""
    row = Record(
        LogEvent.LIMIT_EXCEEDED,
        actor=route.client_id,
        rpc_id=rpc_id,
        topic=pattern,
        status="max_subscriptions",
    )
    return [row, Fail(LimitExceeded(f"at most {limit} subscriptions per connection"))]


def unsubscribe(
    router: Router[K], route: Route[K], params: Any, *, rpc_id: str | None
) -> list[Action]:
    """``unsubscribe``: drop a pattern the peer has; -32003 if it has not."""
    try:
        pattern = parse(UnsubscribeParams, params).topic
    except BusError as exc:
        return [Fail(exc)]
    if not router.unsubscribe(route.handle, pattern):
        return [Fail(SubscriptionNotFound(f"not subscribed to {pattern!r}"))]
    row = Record(LogEvent.UNSUBSCRIBE, actor=route.client_id, rpc_id=rpc_id, topic=pattern)
    return [row, Reply(SubscribeResult())]


def list_subscriptions(route: Route[Any]) -> list[Action]:
    """``listSubscriptions``: the peer's patterns, sorted, each with its push options."""
    subscriptions = []
    for pattern in sorted(route.patterns):
        options = route.options.get(pattern, PLAIN)
        subscriptions.append(
            SubscriptionInfo(
                topic=pattern,
                debounce_ms=options.debounce_ms,
                min_relevance=options.min_relevance,
            )
        )
    return [Reply(ListSubscriptionsResult(subscriptions=subscriptions))]


def admit_admin(route: Route[Any], rpc_id: str | None, method: str) -> list[Action]:
    """Whether the peer may call an admin method (``listPeers``): nothing to do if it may,
    else its refusal and the -32002 to answer."""
    if route.grants.admin:
        return []
    denied = Forbidden(
        f"{route.client_id} may not call {method}: it is for roles with `admin: true` "
        "in the policy (the default policy's operator role, operator:*)"
    )
    return [refusal(route, rpc_id, method, "admin_denied"), Fail(denied)]


class LinkFacts(NamedTuple):
    """What ``listPeers`` shows of a peer's link, which only its transport knows."""

    address: str
    requests: int = 0
    deliveries: int = 0


def list_peers(
    routes: Iterable[Route[K]],
    since: Mapping[K, str | None],
    facts: Callable[[K], LinkFacts],
    *,
    now: str,
) -> list[Action]:
    """``listPeers`` (after :func:`admit_admin`): every authenticated peer, sorted by
    clientId, with when it joined (``now`` if unknown) and its link's address and load."""
    return [Reply(peer_list(routes, since, facts, now=now))]


def peer_list(
    routes: Iterable[Route[K]],
    since: Mapping[K, str | None],
    facts: Callable[[K], LinkFacts],
    *,
    now: str,
) -> ListPeersResult:
    """The peers :func:`list_peers` answers with, as a result a caller may still extend (a
    bus node adds the other nodes' peers to its own)."""
    peers = []
    for route in sorted(routes, key=lambda r: r.client_id):
        link = facts(route.handle)
        peers.append(
            {
                "clientId": route.client_id,
                "roles": sorted(route.grants.roles),
                "taint": route.grants.taint,
                "since": since.get(route.handle) or now,
                "address": link.address,
                "subscriptions": sorted(route.patterns),
                "inflight": {"requests": link.requests, "deliveries": link.deliveries},
            }
        )
    return ListPeersResult.model_validate({"peers": peers})


class Admission(NamedTuple):
    """What :func:`admit_send` decided: the message's fields and topic when it is admitted
    (``actions`` is then empty), else the refusal to carry out."""

    actions: list[Action]
    fields: SendFields | None = None
    topic: str = ""


def admit_send(
    route: Route[Any],
    params: Any,
    *,
    rpc_id: str | None,
    recent: RecentIds | None,
    now: float,
) -> Admission:
    """``sendMessage``'s checks before the message is accepted: the params, ``from`` is the
    sender, the policy lets its roles send this type to this topic, and the messageId is not a
    duplicate within the window (claimed here: release it if the message is not accepted)."""
    try:
        fields = read_send_message(params)
        topic = validate_topic(fields.topic)
    except BusError as exc:
        return Admission([Fail(exc)])
    refused = _authorize_send(route, rpc_id, fields, topic)
    if refused:
        return Admission(refused)
    if recent is not None and not recent.claim((route.client_id, fields.message_id), now):
        row = refusal(
            route, rpc_id, "sendMessage", "duplicate", topic=topic, message_id=fields.message_id
        )
        duplicate = DuplicateMessage(
            f"Duplicate messageId: {route.client_id} already sent {fields.message_id!r} "
            f"within the last {recent.window:g} s; it was accepted then, do not send it again",
            data={"messageId": fields.message_id},
        )
        return Admission([row, Fail(duplicate)])
    return Admission([], fields, topic)


def _authorize_send(
    route: Route[Any], rpc_id: str | None, fields: SendFields, topic: str
) -> list[Action]:
    """The refusal of a ``from`` that is not the sender, or of a type the policy denies."""
    if fields.sender != route.client_id:
        reason, error = (
            "from_mismatch",
            f"payload.from is {fields.sender!r} but this connection is {route.client_id!r}",
        )
    elif not route.grants.may_send(fields.type, topic):
        roles = ", ".join(sorted(route.grants.roles)) or "none"
        reason, error = (
            "type_denied",
            f"{route.client_id} (roles: {roles}) may not send {fields.type!r} to {topic!r}",
        )
    else:
        return []
    row = refusal(route, rpc_id, "sendMessage", reason, topic=topic, message_id=fields.message_id)
    return [row, Fail(Forbidden(error))]


class FetchAdmission(NamedTuple):
    """What :func:`admit_fetch` decided: the pattern and page size to read when the read is
    admitted (``actions`` is then empty), else the refusal to carry out."""

    actions: list[Action]
    pattern: str = ""
    limit: int = 0


def admit_fetch(
    grants: Grants,
    pattern: str,
    limit: int | None,
    *,
    rpc_id: str | None,
    digests_only: bool,
    cap: int,
) -> FetchAdmission:
    """``fetchMessages``'s checks before the log is read: a valid pattern the policy lets the
    peer subscribe to, on a log that keeps content; ``limit`` capped to ``cap`` (None: the
    cap)."""
    try:
        pattern = validate_pattern(pattern)
    except BusError as exc:
        return FetchAdmission([Fail(exc)])
    client_id = grants.client_id
    if not grants.may_subscribe(pattern):
        row = Record(
            LogEvent.REFUSED, actor=client_id, rpc_id=rpc_id, topic=pattern, status="fetch_denied"
        )
        denied = Forbidden(f"{client_id} may not read {pattern!r}: the policy does not grant it")
        return FetchAdmission([row, Fail(denied)])
    if digests_only:
        kept = ContentNotKept(
            "This bus keeps only digests of messages (log_content: digest), not their "
            "content: there is nothing to fetch"
        )
        return FetchAdmission([Fail(kept)])
    return FetchAdmission([], pattern, cap if limit is None else max(1, min(limit, cap)))
