"""One approval as the console shows it: plain values the templates write out, no decisions.

:func:`card` reads a stored approval (:class:`peers.approver.StoredApproval`) defensively, as
:func:`peers.approver.render_request` does: the request comes from the log, and a part that is
missing or of the wrong type shows as missing, never as an error. Every string stays a string:
the templates escape it and mark its hidden characters (:func:`peers.console.text.reveal`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..approver import StoredApproval

__all__ = ["Card", "card"]

_KINDS = {
    "response": "A reader's answer",
    "escalation": "A controller's escalation to a Cat-3 summary",
}
_DONE = {
    "approved": "Approved",
    "rejected": "Rejected",
    "edited": "Edited and delivered",
    "expired": "Expired: nobody decided in time, which counts as rejected",
}


@dataclass(frozen=True)
class Card:
    """What one approval card shows."""

    approval_id: str
    kind: str
    title: str
    controller: str
    reader: str
    taint: str
    query_id: str | None
    subscription_id: str | None
    task_id: str | None
    category: str
    asked: tuple[tuple[str, str], ...]
    """What the controller asked: ``(label, text)`` lines."""
    justification: str | None
    """An escalation's reason, written by the controller."""
    answer: tuple[tuple[str, str], ...]
    """The reader's text under review, ``(key, text)``: untrusted."""
    anomalies: tuple[tuple[str, str], ...]
    created_ts: str
    expires_ts: str | None
    status: str
    open: bool
    """Still waiting for a decision: pending and not past its expiry."""
    outcome: str | None
    """For a decided approval: what became of it."""
    decided_by: str | None
    decided_ts: str | None
    reason: str | None

    @property
    def state(self) -> str:
        """Changes whenever the card must be drawn again."""
        return f"{self.status}:{int(self.open)}"


def card(approval: StoredApproval, now: datetime | None = None) -> Card:
    """The card of ``approval`` as of ``now`` (default: the current time)."""
    request = approval.request
    found = request.get("spec")
    spec: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    kind = _text(request.get("kind"))
    decision = approval.decision or {}
    is_open = approval.is_open(now or datetime.now(UTC))
    outcome = _DONE.get(approval.status, approval.status) if approval.status != "pending" else None
    if approval.status == "pending" and not is_open:
        outcome = "Past its expiry: it counts as rejected"
    return Card(
        approval_id=approval.approval_id,
        kind=kind,
        title=_KINDS.get(kind, kind or "An approval")
        + (" waits for a decision" if is_open else ""),
        controller=_text(request.get("controller")),
        reader=_text(request.get("reader")),
        taint=_text(request.get("taint", "high")),
        query_id=_optional(request.get("query_id")),
        subscription_id=_optional(request.get("subscription_id")),
        task_id=_optional(request.get("task_id")),
        category=_text(spec.get("category")),
        asked=tuple(_asked(spec)),
        justification=_optional(request.get("escalation_justification")),
        answer=tuple(_items(request.get("response"))) if kind != "escalation" else (),
        anomalies=tuple(_anomalies(request.get("anomalies"))),
        created_ts=approval.created_ts,
        expires_ts=approval.expires_ts,
        status=approval.status,
        open=is_open,
        outcome=outcome,
        decided_by=approval.decided_by,
        decided_ts=approval.decided_ts,
        reason=_optional(decision.get("reason")),
    )


def _asked(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    lines = []
    for field in _each(spec.get("fields")):
        kind = _text(field.get("type"))
        if kind == "integer":
            kind = f"integer {_text(field.get('min'))}..{_text(field.get('max'))}"
        elif kind == "enum":
            kind = "one of " + " | ".join(_text(v) for v in field.get("values") or ())
        lines.append((_text(field.get("name")), kind))
    for question in _each(spec.get("questions")):
        label = f"{_text(question.get('id'))} ({_text(question.get('expected_format'))}, up to "
        label += f"{_text(question.get('max_words'))} words)"
        lines.append((label, _text(question.get("question"))))
    if spec.get("directive") is not None:
        lines.append(("directive", _text(spec.get("directive"))))
        lines.append(("length", f"up to {_text(spec.get('max_words'))} words"))
    return lines


def _items(value: Any) -> list[tuple[str, str]]:
    if value is None:
        return [("(nothing)", "")]
    if not isinstance(value, Mapping):
        return [("(as sent)", _as_text(value))]
    return [(_text(key), _as_text(item)) for key, item in value.items()]


def _anomalies(value: Any) -> list[tuple[str, str]]:
    found = []
    for anomaly in _each(value):
        where = f" in {_text(anomaly['field'])}" if anomaly.get("field") else ""
        found.append((f"{_text(anomaly.get('code'))}{where}", _text(anomaly.get("detail", ""))))
    return found


def _each(value: Any) -> list[Mapping[str, Any]]:
    if not isinstance(value, list | tuple):
        return []
    return [item for item in value if isinstance(item, Mapping)]


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _optional(value: Any) -> str | None:
    return None if value is None else str(value)
