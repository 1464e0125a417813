"""What a reloaded configuration changes for the peers already connected. Pure: no sockets.

When the peers file, the policy or the agent definitions change under a running bus
(:mod:`bus.ops.reload`), each connected peer is looked at again, as if it initialized now with the
token it used:

- its token is no longer in the peers file (removed, or rotated to a new one): :class:`Revoke`,
  and the bus closes it with 4005 (``CLOSE_REVOKED``);
- the policy no longer admits the roles it would hold: :class:`Revoke` as well;
- otherwise :class:`Regrant`: its new grants, and the subscriptions they no longer allow, which
  the bus drops (a peer whose rights grew keeps its subscriptions and may add more).

::

    for change in review(router.routes(), credentials, policy, identities):
        match change:
            case Revoke(route, reason): ...
            case Regrant(route, grants, dropped): ...
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.identities import PeerIdentity
from ..core.policy import Grants, Policy, PolicyError
from ..core.router import Route
from .credentials import Credentials

__all__ = ["Change", "Regrant", "Revoke", "review"]


@dataclass(frozen=True)
class Revoke:
    """Close this peer's connection: it could not initialize again."""

    route: Route[Any]
    reason: str
    """``removed``, ``rotated`` or ``policy``, the log row's status."""
    detail: str


@dataclass(frozen=True)
class Regrant:
    """Give this peer new grants and drop the subscriptions they no longer allow."""

    route: Route[Any]
    grants: Grants
    dropped: tuple[str, ...]


Change = Revoke | Regrant


def review(
    routes: Iterable[Route[Any]],
    credentials: Credentials,
    policy: Policy,
    identities: Mapping[str, PeerIdentity],
) -> list[Change]:
    """Return what the new configuration means for each connected peer, in the order given."""
    return [_review(route, credentials, policy, identities) for route in routes]


def _review(
    route: Route[Any],
    credentials: Credentials,
    policy: Policy,
    identities: Mapping[str, PeerIdentity],
) -> Change:
    client_id = route.client_id
    record = credentials.record(client_id)
    if record is None:
        return Revoke(route, "removed", f"{client_id} is no longer in the peers file")
    if route.credential is not None and record.token_hash != route.credential:
        return Revoke(route, "rotated", f"{client_id}'s token was replaced")
    identity = identities.get(client_id, PeerIdentity())
    try:
        roles = policy.roles_for(client_id, (*record.roles, *identity.roles))
        grants = policy.grants(client_id, roles, taint=identity.taint)
    except (PolicyError, ValueError) as exc:
        return Revoke(route, "policy", str(exc))
    dropped = tuple(sorted(p for p in route.patterns if not grants.may_subscribe(p)))
    return Regrant(route, grants, dropped)
