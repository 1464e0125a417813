"""What the bus does about links that have not authenticated: count, never log row by row.

Anyone can open a socket and send garbage, so an anonymous link's mistakes are counted into the
next ``ws_refused`` row (:mod:`bus.ops.refusals`) rather than written one row each, and a link
that keeps making them is closed (1008) before the ``initialize`` timeout: otherwise anyone
could fill the audit log. An authenticated peer's mistakes get rows of their own. Pure: the
shell carries out the actions (:mod:`bus.core.actions`)::

    for action in error_answered(states.get(conn), conn, address, closing=False): ...
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

from .actions import Action, Close, CountRefusal, Record
from .errors import CLOSE_POLICY_VIOLATION
from .logevents import LogEvent
from .state import PeerState

__all__ = ["error_answered", "frame_refused"]

K = TypeVar("K", bound=Hashable)

TOO_MANY_ERRORS = "too many errors before initialize"


def error_answered(
    state: PeerState | None, link: K, address: str, *, closing: bool
) -> list[Action]:
    """An anonymous link got an error answer: count it; at the
    :data:`~bus.core.state.MAX_ANONYMOUS_ERRORS`-th, close the link (1008) after the answer.
    A link already closing after this answer is only counted."""
    actions: list[Action] = [CountRefusal("rpc_error", address)]
    if closing or state is None or not state.count_error():
        return actions
    return [
        *actions,
        CountRefusal("anonymous_errors", address),
        Close(link, CLOSE_POLICY_VIOLATION, TOO_MANY_ERRORS, True),
        Close(link, CLOSE_POLICY_VIOLATION, TOO_MANY_ERRORS),
    ]


def frame_refused(
    event: LogEvent,
    client_id: str | None,
    address: str,
    *,
    status: str | None = None,
    error: str | None = None,
) -> list[Action]:
    """A frame the bus does not take (``frame_refused``, ``frame_too_large``): a row for a
    peer, a count for an anonymous link."""
    if client_id is None:
        return [CountRefusal(event.value, address)]
    return [Record(event, actor=client_id, status=status, error=error)]
