"""Small types and names several wire models, the bus and the peers share: taint levels,
identifier aliases, the gateway's well-known names, the timestamp format."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Final, Literal, NewType

__all__ = [
    "APPROVAL_TOPIC",
    "BUS_CLIENT_ID",
    "GATEWAY_CLIENT_ID",
    "TAINT_LEVELS",
    "TRACEPARENT_FORBIDDEN",
    "TRACEPARENT_PATTERN",
    "ClientId",
    "TaintLevel",
    "Topic",
    "agent_id",
    "step_down",
    "taint_rank",
    "timestamp",
    "trace_id",
    "traceparent_problem",
]

ClientId = NewType("ClientId", str)
"""An authenticated peer identity, ``prefix:name`` (``agent:main``, ``system:gateway``)."""

Topic = NewType("Topic", str)
"""A concrete topic: ``:``-separated segments, no ``*``."""

GATEWAY_CLIENT_ID: Final = ClientId("system:gateway")
"""The BCP gateway's clientId: the default policy's ``gateway`` role, the only sender of
approval requests an approver accepts."""

BUS_CLIENT_ID: Final = ClientId("system:bus")
"""The bus's own clientId: the sender of presence and ``delivery_status`` messages and the actor
of the log rows no peer caused. No peer can log in under it (``system:`` names are reserved)."""

APPROVAL_TOPIC: Final = Topic("system:approval")
"""Where the gateway publishes approval requests and approvers publish their decisions."""


def agent_id(name: str) -> ClientId:
    """Return the clientId of the agent defined as ``name`` in ``agents/``: ``agent:<name>``."""
    return ClientId(f"agent:{name}")


def timestamp(moment: datetime | None = None) -> str:
    """Return ``moment`` (default: now) as RFC 3339 in UTC with milliseconds and ``Z``.

    ``2026-01-02T03:04:05.678Z``: the form of every time on the wire. (The activity log's ``ts``
    column keeps microseconds, in a fixed-width form of its own that sorts as text; see
    :mod:`bus.log.activity`.)
    """
    moment = datetime.now(UTC) if moment is None else moment.astimezone(UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


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


# W3C Trace Context (https://www.w3.org/TR/trace-context/#traceparent-header): version,
# trace-id, parent-id and trace-flags, lowercase hex. The form is version 00's; a version other
# than 00 is read the same way (its extra fields, if any, are refused rather than ignored).
TRACEPARENT_PATTERN: Final = r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
"""The form of a ``traceparent``: ``00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>``."""
TRACEPARENT_FORBIDDEN: Final = r"^(?:ff-|[0-9a-f]{2}-0{32}-|[0-9a-f]{2}-[0-9a-f]{32}-0{16}-)"
"""What W3C forbids within that form: version ``ff``, an all-zero trace id or parent id."""
_TRACEPARENT_RE = re.compile(TRACEPARENT_PATTERN[1:-1])


def traceparent_problem(value: str) -> str | None:
    """Return what is wrong with ``value`` as a W3C ``traceparent``, or None if it is valid."""
    if _TRACEPARENT_RE.fullmatch(value) is None:
        return (
            "expected 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>, lowercase "
            "(W3C Trace Context)"
        )
    version, trace, parent, _flags = value.split("-")
    if version == "ff":
        return "version ff is invalid"
    if trace == "0" * 32:
        return "the trace id is all zeros"
    if parent == "0" * 16:
        return "the parent id is all zeros"
    return None


def trace_id(traceparent: str) -> str:
    """Return the trace id of a valid ``traceparent``: its 32 hex digits after the version."""
    return traceparent[3:35]
