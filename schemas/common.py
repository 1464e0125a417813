"""Small types several wire models and the bus share: taint levels and identifier aliases."""

from __future__ import annotations

from typing import Literal, NewType

__all__ = ["TAINT_LEVELS", "ClientId", "TaintLevel", "Topic", "step_down", "taint_rank"]

ClientId = NewType("ClientId", str)
"""An authenticated peer identity, ``prefix:name`` (``agent:main``, ``system:gateway``)."""

Topic = NewType("Topic", str)
"""A concrete topic: ``:``-separated segments, no ``*``."""

TaintLevel = Literal["none", "low", "medium", "high"]
"""How much attacker-written content a peer has read, lowest first."""

TAINT_LEVELS: tuple[TaintLevel, ...] = ("none", "low", "medium", "high")


def taint_rank(level: TaintLevel) -> int:
    """Return the order of ``level``: ``none`` is 0, ``high`` is 3."""
    return TAINT_LEVELS.index(level)


def step_down(level: TaintLevel) -> TaintLevel:
    """Return the taint a gateway delivery carries: one level lower, never below ``low``.

    BCP: high -> medium -> low -> low. Data that came from a tainted reader never becomes
    ``none``; an untainted level stays ``none``.
    """
    if level == "none":
        return "none"
    return TAINT_LEVELS[max(1, taint_rank(level) - 1)]
