"""Carrying out what the bus core decided: :class:`Carry` turns a list of
:mod:`bus.core.actions` into rows, presence, closed links, counted refusals, and a reply or an
error.

Every part of the shell (:mod:`bus.members`, :mod:`bus.methods`, :mod:`bus.readback`, the
WebSocket door) hands the core's actions to the bus's one ``Carry``; a decision's reply comes
back as its wire form, its error is raised.
"""

from __future__ import annotations

from typing import Any

from .core.actions import Action, Announce, Close, Commit, CountRefusal, Fail, Record, Reply
from .core.presence import Presence
from .fanout import record_row
from .log.activity import ActivityLog
from .ops.refusals import Refusals

__all__ = ["Carry"]


class Carry:
    """Carries out actions for one bus: its log, its presence, its refusal counts."""

    def __init__(self, log: ActivityLog, presence: Presence, refusals: Refusals) -> None:
        self._log = log
        self._presence = presence
        self._refusals = refusals

    def __call__(self, actions: list[Action]) -> Any:
        """Carry out a decision's actions in order; return the reply's wire form, raise its
        error, or return None if it has neither."""
        for action in actions:
            match action:
                case Record():
                    record_row(self._log, action)
                case Announce(kind=kind, content=content):
                    self._presence.announce(kind, content)
                case Close(link=link, code=code, reason=reason, after_answer=True):
                    link.close_after_answer(code, reason)
                case Close(link=link, code=code, reason=reason, force=True):
                    link.spawn(link.force_close(code, reason))
                case Close(link=link, code=code, reason=reason):
                    link.spawn(link.close(code, reason))
                case CountRefusal(reason=reason, address=address):
                    self._refusals.count(reason, address)
                case Reply(result=result):
                    return result.model_dump(by_alias=True)
                case Fail(error=error):
                    raise error
                case Commit():  # pragma: no cover - no request decision commits yet
                    raise AssertionError("commit inside a request decision")
        return None
