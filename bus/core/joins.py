"""The bus's decisions on a peer joining: ``initialize`` over a link, a webhook peer attached,
a request that arrived without a link. Pure: the credential check's outcome comes in, actions
go out (:mod:`bus.core.actions`), and the routing table changes here with no await between the
checks and the join.

What a join checks, in order: the credential (no row: anyone may try, a ``ws_refused`` count
keeps the tally), that the peer is not one the bus reaches another way (a webhook), room
(``max_connections``; a takeover is not one more), and the roles the policy allows its
clientId. A peer that passes is joined, takes over an older link of the same clientId, is
subscribed to its own clientId, logged and announced::

    actions = initialize(router, link, Credential(roles, token_hash), ask, rules)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from schemas.bus import Capabilities, InitializeResult, PeerJoined, PeerLeft, ServerInfo

from .actions import Action, Announce, Close, CountRefusal, Fail, Record, Reply
from .errors import (
    CLOSE_AUTH_FAILED,
    CLOSE_REPLACED,
    CLOSE_REVOKED,
    CLOSE_TRY_AGAIN_LATER,
    AuthenticationFailed,
    LimitExceeded,
)
from .identities import PeerIdentity
from .logevents import LogEvent
from .policy import Grants, Policy, PolicyError
from .router import Route, Router

__all__ = [
    "Ask",
    "Credential",
    "Granted",
    "Rules",
    "WrongToken",
    "attach",
    "grant",
    "initialize",
    "join",
    "leave",
    "regrant",
    "replaced_elsewhere",
    "revoke",
]

K = TypeVar("K", bound=Hashable)

_AUTH_FAILED = "authentication failed"


class WrongToken(AuthenticationFailed):
    """A token that proves no peer: counted into ``ws_refused``, no ``rpc_error`` row."""


class Credential(NamedTuple):
    """What a verified token proves: the roles the peers file gives, and the token's hash
    (a reload that changes it closes the peer)."""

    roles: Iterable[str]
    token_hash: str | None = None


@dataclass(frozen=True, slots=True)
class Ask:
    """One ``initialize`` request: who asks, over which address, and whether it gave a token."""

    client_id: str
    rpc_id: str | None
    address: str
    """The remote IP address: the unit of the anonymous-connection limit."""
    token_given: bool
    remote: str = ""
    """The remote address as the ``connect`` row shows it (address and port)."""


@dataclass(frozen=True, slots=True)
class Rules:
    """What a join is decided by, as configured now."""

    policy: Policy
    identities: Mapping[str, PeerIdentity]
    max_connections: int | None
    server_id: str
    version: str


class Granted(NamedTuple):
    """What :func:`grant` decided: the roles and grants, or the refusal to carry out."""

    actions: list[Action]
    roles: frozenset[str] = frozenset()
    grants: Grants | None = None


def grant(
    rules: Rules,
    client_id: str,
    credential_roles: Iterable[str],
    *,
    rpc_id: str | None = None,
    link: Hashable | None = None,
) -> Granted:
    """The roles and grants the policy gives ``client_id``; if it refuses them (the gateway
    role for a peer that is not a gateway member), an ``auth_failed`` row and -32002, and
    ``link`` (if any) closes with 4003 after the answer."""
    identity = rules.identities.get(client_id, PeerIdentity())
    try:
        roles = rules.policy.roles_for(client_id, (*credential_roles, *identity.roles))
        return Granted([], roles, rules.policy.grants(client_id, roles, taint=identity.taint))
    except (PolicyError, ValueError) as exc:
        row = Record(
            LogEvent.AUTH_FAILED, actor=client_id, rpc_id=rpc_id, status="policy", error=str(exc)
        )
        refused = AuthenticationFailed(
            "Authentication failed: this clientId's roles are not allowed by the policy"
        )
        closing = [] if link is None else [Close(link, CLOSE_AUTH_FAILED, _AUTH_FAILED, True)]
        return Granted([row, *closing, Fail(refused)])


def initialize(
    router: Router[K],
    link: K,
    credential: Credential | None,
    ask: Ask,
    rules: Rules,
    *,
    attached: Callable[[K], bool],
    epoch: int,
) -> list[Action]:
    """``initialize`` over ``link``: the checks above, then the join and its
    :class:`InitializeResult`. ``credential`` is None when the token proved nothing;
    ``attached(handle)`` says whether a handle is a link the bus reaches another way."""
    client_id, rpc_id = ask.client_id, ask.rpc_id
    if credential is None:
        reason = "wrong_token" if ask.token_given else "no_credential"
        closing = Close(link, CLOSE_AUTH_FAILED, _AUTH_FAILED, True)
        return [CountRefusal(reason, ask.address), closing, Fail(WrongToken())]
    refused = _refuse_join(router, link, ask, rules, attached)
    if refused:
        return refused
    granted = grant(rules, client_id, credential.roles, rpc_id=rpc_id, link=link)
    if granted.grants is None:
        return granted.actions
    actions = join(router, link, client_id, granted.roles, granted.grants, credential.token_hash)
    actions.insert(-1, Record(LogEvent.CONNECT, actor=ask.remote))
    actions.insert(-1, _initialized(client_id, rpc_id, granted.roles, granted.grants))
    capabilities = Capabilities(topics=list(granted.grants.subscribe_patterns))
    info = ServerInfo(name="bcpbus", version=rules.version)
    welcome = InitializeResult(
        server_id=rules.server_id, server_info=info, capabilities=capabilities, epoch=epoch
    )
    return [*actions, Reply(welcome)]


def _refuse_join(
    router: Router[K], link: K, ask: Ask, rules: Rules, attached: Callable[[K], bool]
) -> list[Action]:
    """The refusal of a peer the bus reaches another way (4003), or of one peer more than
    ``max_connections`` (1013); nothing if neither applies."""
    client_id, rpc_id = ask.client_id, ask.rpc_id
    route = router.route_of(client_id)
    if route is not None and attached(route.handle):
        row = Record(LogEvent.AUTH_FAILED, actor=client_id, rpc_id=rpc_id, status="webhook")
        refused = AuthenticationFailed(
            f"Authentication failed: {client_id} is a webhook peer, which the bus reaches at "
            "its URL; it cannot also connect over WebSocket (re-add it without --webhook)"
        )
        return [row, Close(link, CLOSE_AUTH_FAILED, _AUTH_FAILED, True), Fail(refused)]
    limit = rules.max_connections
    if limit is None or client_id in router or len(router) < limit:
        return []
    row = Record(LogEvent.LIMIT_EXCEEDED, actor=client_id, rpc_id=rpc_id, status="max_connections")
    full = LimitExceeded(f"Limit exceeded: the bus already has {limit} peers; retry later")
    return [row, Close(link, CLOSE_TRY_AGAIN_LATER, "too many peers", True), Fail(full)]


def join(
    router: Router[K],
    link: K,
    client_id: str,
    roles: frozenset[str],
    grants: Grants,
    credential: str | None = None,
) -> list[Action]:
    """Join ``link`` as ``client_id``: take over an older link of that clientId, subscribe it
    to its own clientId, and announce it (the last action, so the caller may put its
    ``initialize`` row before)."""
    actions: list[Action] = []
    replaced = router.join(link, client_id, grants, credential=credential)
    if replaced is not None:
        actions.append(Record(LogEvent.REPLACED, actor=client_id, status=str(CLOSE_REPLACED)))
        actions.append(Announce("peer_left", PeerLeft(client_id=client_id, reason="replaced")))
        actions.append(Close(replaced, CLOSE_REPLACED, "replaced by a newer connection"))
    if grants.may_subscribe(client_id):
        # As in the seed protocol, a peer is subscribed to its own address from the start,
        # so what others send it in answer to peer_joined (the gateway does) is not lost.
        router.subscribe(link, client_id)
    actions.append(Announce("peer_joined", PeerJoined(client_id=client_id, roles=sorted(roles))))
    return actions


def _initialized(
    client_id: str, rpc_id: str | None, roles: frozenset[str], grants: Grants, **extra: Any
) -> Record:
    payload = {"roles": sorted(roles), "taint": grants.taint, **extra}
    return Record(LogEvent.INITIALIZE, actor=client_id, rpc_id=rpc_id, status="ok", payload=payload)


def attach(
    router: Router[K], link: K, client_id: str, roles: Iterable[str], rules: Rules, *, name: str
) -> list[Action]:
    """Join a peer the bus reaches through ``link`` rather than a socket (a webhook), as
    ``initialize`` would; its ``initialize`` row names the link."""
    granted = grant(rules, client_id, roles)
    if granted.grants is None:
        return granted.actions
    actions = join(router, link, client_id, granted.roles, granted.grants)
    actions.insert(-1, _initialized(client_id, None, granted.roles, granted.grants, link=name))
    return actions


def leave(router: Router[K], link: K, status: str) -> list[Action]:
    """Forget ``link``: a ``disconnect`` row and a ``peer_left``, unless it never joined or
    was replaced (the takeover logged and announced that)."""
    route = router.leave(link)
    if route is None:
        return []
    return [
        Record(LogEvent.DISCONNECT, actor=route.client_id, status=status),
        Announce("peer_left", PeerLeft(client_id=route.client_id, reason="disconnected")),
    ]


def replaced_elsewhere(router: Router[K], client_id: str, node: str) -> list[Action]:
    """``client_id`` logged in again on another bus node (``node``): its link here leaves the
    table and closes with 4001. Nothing is announced: the newer link's node announces it.
    No actions if it has no link here."""
    route = router.route_of(client_id)
    if route is None:
        return []
    router.leave(route.handle)
    return [
        Record(LogEvent.REPLACED, actor=client_id, status=str(CLOSE_REPLACED), error=node),
        Close(route.handle, CLOSE_REPLACED, f"replaced by a link on {node}"),
    ]


def revoke(router: Router[K], route: Route[K], reason: str, detail: str) -> list[Action]:
    """A reload took this peer's credential or rights (``reason``: ``removed``, ``rotated``,
    ``policy``): it leaves the table at once, so it receives nothing and may do nothing more,
    and its link closes with 4005."""
    router.leave(route.handle)
    return [
        Record(LogEvent.REVOKED, actor=route.client_id, status=reason, error=detail),
        Announce("peer_left", PeerLeft(client_id=route.client_id, reason="revoked")),
        Close(route.handle, CLOSE_REVOKED, f"revoked: {reason}"),
    ]


def regrant(
    router: Router[K], route: Route[K], grants: Grants, dropped: Iterable[str]
) -> list[Action]:
    """A reload gave this peer new ``grants``: put them in force and drop the subscriptions
    they no longer allow, each with an ``unsubscribe`` row (status ``revoked``)."""
    route.grants = grants
    actions: list[Action] = []
    for pattern in dropped:
        router.unsubscribe(route.handle, pattern)
        actions.append(
            Record(LogEvent.UNSUBSCRIBE, actor=route.client_id, topic=pattern, status="revoked")
        )
    return actions
