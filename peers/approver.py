"""The human side of BCP approval: receive the gateway's approval requests, show them, decide.

The gateway (``system:gateway``) asks a human before it delivers a Cat-3 summary, an answer a
``review`` channel flagged, or an escalation into Cat-3. It publishes ``bcp_approval_request`` on
``system:approval``; any approver (``human:<name>``, policy role ``approver``) answers with a
``bcp_approval_decision`` on the same topic::

    async with Approver(Peer(url, "human:alice", token)) as approver:
        async for request in approver:
            print(render_request(request))
            if await approver.approve(request.approval_id):
                print("the gateway took the decision")

The text under review was written by a tainted reader, which must be assumed hostile:
:func:`render_request` labels it as untrusted and escapes every character that could steer a
terminal (ANSI escapes, other control characters, bidi overrides, invisible characters).

The gateway also keeps every approval in the ``bcp_approvals`` table of its SQLite database;
:func:`read_approvals` and :func:`read_approval` read it without a bus connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import sqlite3
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from bus.log import audit
from bus.log.audit import has_relation, neutralize, read_only, untrusted_lines
from schemas.bcp import UNTRUSTED_NOTICE, BcpApprovalDecision, BcpApprovalRequest
from schemas.common import APPROVAL_TOPIC, GATEWAY_CLIENT_ID

from .client import Message, Peer, PeerClosed, Reply

__all__ = [
    "APPROVAL_TOPIC",
    "GATEWAY_ID",
    "Approver",
    "Decision",
    "RequestCallback",
    "StoredApproval",
    "decision_refusal",
    "edited_response",
    "neutralize",
    "read_approval",
    "read_approvals",
    "render_request",
]

logger = logging.getLogger("peers.approver")

GATEWAY_ID = GATEWAY_CLIENT_ID
"""The only clientId whose approval requests an :class:`Approver` accepts."""

Decision = Literal["approve", "reject", "edit"]
"""What an approver may decide."""

RequestCallback = Callable[[BcpApprovalRequest], Awaitable[None] | None]
"""Called with each new request; see :meth:`Approver.on_request`."""


class Approver:
    """A human approver on the bus: collects pending approval requests and decides them.

    Wraps a :class:`Peer` whose clientId holds the ``approver`` role (``human:<name>`` in the
    default policy). :meth:`start` (or ``async with``) connects it if needed and subscribes to
    ``system:approval``; from then on every request the gateway publishes is kept in
    :attr:`pending` until it is decided, by this approver or another one, or expires.

    Deciding needs no subscription: ``Approver(peer).decide(...)`` on a connected peer is enough.

    Args:
        peer: the connection to use; the approver registers its handlers on it.
        gateway_id: requests from any other sender are refused.
        max_pending: requests kept at most; more are answered ``processed: false``.
    """

    def __init__(
        self, peer: Peer, *, gateway_id: str = GATEWAY_ID, max_pending: int = 10_000
    ) -> None:
        self.peer = peer
        """The connection; close it through :meth:`close`."""
        self.gateway_id = gateway_id
        self.max_pending = max_pending
        self._pending: dict[str, BcpApprovalRequest] = {}
        self._unseen: dict[str, None] = {}  # an ordered set: pending ids not yet handed out
        self._callbacks: list[RequestCallback] = []
        self._changed = asyncio.Event()
        self._closed = False
        peer.handle("bcp_approval_request", self._on_request)
        peer.handle("bcp_approval_decision", self._on_decision)

    # Lifecycle

    async def start(self) -> None:
        """Connect the peer unless it is connected, then subscribe to ``system:approval``.

        The gateway re-sends every pending request when an approver joins, so requests made
        before the start arrive too. Then iterate, call :meth:`next_request`, or read
        :attr:`pending`.

        Raises:
            AuthenticationFailed: the bus refused the clientId or token.
            InvalidParams: the clientId may not subscribe to ``system:approval``: not an approver.
            OSError: the bus cannot be reached.
        """
        if not self.peer.connected.is_set():
            await self.peer.connect()
        await self.peer.subscribe(APPROVAL_TOPIC)

    async def close(self) -> None:
        """Close the peer and end every iteration over this approver. Idempotent."""
        self._closed = True
        self._changed.set()
        await self.peer.close()

    async def __aenter__(self) -> Approver:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # Requests

    @property
    def pending(self) -> dict[str, BcpApprovalRequest]:
        """The undecided, unexpired requests by ``approval_id``, oldest first (a copy)."""
        self._drop_expired()
        return dict(self._pending)

    def on_request(self, callback: RequestCallback) -> RequestCallback:
        """Register ``callback`` (a function or coroutine) for each new request; usable as a
        decorator.

        It runs before the gateway's delivery is answered, so keep it short: to ask a person,
        iterate over the approver instead. An exception it raises is logged and ignored.
        """
        self._callbacks.append(callback)
        return callback

    async def next_request(self) -> BcpApprovalRequest:
        """Wait for a pending request not handed out before, and return it.

        Each request is returned once, even if the gateway re-sends it; requests decided or
        expired meanwhile are skipped. To bound the wait, wrap the call in
        ``asyncio.timeout()``.

        Raises:
            PeerClosed: the approver is closed.
        """
        while True:
            self._drop_expired()
            if self._unseen:
                approval_id = next(iter(self._unseen))
                del self._unseen[approval_id]
                return self._pending[approval_id]
            if self._closed:
                raise PeerClosed(f"{self.peer.client_id}: the approver is closed")
            self._changed.clear()
            await self._changed.wait()

    def __aiter__(self) -> AsyncIterator[BcpApprovalRequest]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[BcpApprovalRequest]:
        while True:
            try:
                yield await self.next_request()
            except PeerClosed:
                return

    # Decisions

    async def decide(
        self,
        approval_id: str,
        decision: Decision,
        *,
        edited_response: dict[str, Any] | None = None,
        reason: str | None = None,
        message_id: str | None = None,
    ) -> bool:
        """Send a decision to the gateway; return whether it took it.

        ``False`` means the gateway refused it: the approval is unknown, already decided or
        expired, or (``edit``) the edited response failed validation; check with
        ``bcpbus approve show ID``. Nothing else on ``system:approval`` counts as taking a
        decision, because approvers answer the decisions they observe ``processed: false``.

        Args:
            approval_id: from the request.
            decision: ``approve``, ``reject`` or ``edit``.
            edited_response: with ``edit`` only: the full replacement response, e.g.
                ``{"summary": "..."}``; the gateway validates it again against the same spec.
            reason: optional, for the audit trail.
            message_id: the payload's ``messageId``, to find the decision in the activity log.

        Raises:
            ValueError: the decision is malformed (``edit`` without ``edited_response``, ...).
            InvalidParams: the bus refused it: this peer is not an approver.
            PeerClosed: the peer is not connected.
        """
        content = BcpApprovalDecision(
            approval_id=approval_id,
            decision=decision,
            edited_response=edited_response,
            reason=reason,
        ).model_dump(mode="json", exclude_none=True)
        result = await self.peer.send(
            APPROVAL_TOPIC, "bcp_approval_decision", content, message_id=message_id
        )
        taken = result.delivered_to >= 1
        logger.info(
            "%s: %s %s: %s",
            self.peer.client_id,
            decision,
            approval_id,
            "taken" if taken else "refused by the gateway",
        )
        if taken:
            self._forget(approval_id)
        return taken

    async def approve(self, approval_id: str, *, reason: str | None = None) -> bool:
        """Approve: the gateway delivers the response as it is. See :meth:`decide`."""
        return await self.decide(approval_id, "approve", reason=reason)

    async def reject(self, approval_id: str, *, reason: str | None = None) -> bool:
        """Reject: the controller gets ``bcp_query_failed`` (``approval_rejected``) or, for an
        escalation, ``escalation_rejected``. See :meth:`decide`."""
        return await self.decide(approval_id, "reject", reason=reason)

    async def edit(
        self, approval_id: str, edited_response: dict[str, Any], *, reason: str | None = None
    ) -> bool:
        """Replace the response with ``edited_response``, which the gateway validates again
        before delivering it. See :meth:`decide`."""
        return await self.decide(
            approval_id, "edit", edited_response=edited_response, reason=reason
        )

    # Deliveries

    async def _on_request(self, message: Message) -> Reply:
        if message.sender != self.gateway_id:
            return Reply(False, "not_gateway", f"approval requests come from {self.gateway_id}")
        try:
            request = BcpApprovalRequest.model_validate(message.content)
        except ValidationError as exc:
            logger.warning("%s: malformed approval request: %s", self.peer.client_id, exc)
            return Reply(False, "invalid", "malformed bcp_approval_request")
        approval_id = request.approval_id
        if _expired(request.expires_at):
            return Reply(False, "expired", f"{approval_id} expired before it arrived")
        if approval_id in self._pending:
            return Reply(True, "known")  # the gateway re-sends pending requests on a join
        self._drop_expired()
        if len(self._pending) >= self.max_pending:
            return Reply(False, "too_many_pending", f"{self.max_pending} requests are pending")
        self._pending[approval_id] = request
        self._unseen[approval_id] = None
        self._changed.set()
        for callback in self._callbacks:
            try:
                outcome = callback(request)
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception:
                logger.exception("%s: request callback failed", self.peer.client_id)
        return Reply(True, "pending")

    async def _on_decision(self, message: Message) -> Reply:
        # Another approver decided: whatever the gateway made of it, this request is no longer
        # ours to show. Answer processed: false so that the decider's deliveredTo counts the
        # gateway alone.
        approval_id = message.content.get("approval_id")
        if isinstance(approval_id, str):
            self._forget(approval_id)
        return Reply(False, "observed", "approvers do not take decisions; the gateway does")

    def _forget(self, approval_id: str) -> None:
        self._pending.pop(approval_id, None)
        self._unseen.pop(approval_id, None)

    def _drop_expired(self) -> None:
        for approval_id in [i for i, r in self._pending.items() if _expired(r.expires_at)]:
            self._forget(approval_id)


# Rendering


def render_request(
    content: Mapping[str, Any] | BcpApprovalRequest,
    *,
    now: datetime | None = None,
    width: int = 76,
) -> str:
    """Return a plain-text block that shows a person one approval request.

    The block names the approval, the channel, the query and the expiry; shows what the
    controller asked (the spec); then the text to judge, under the request's untrusted-content
    notice, every line of it prefixed with ``|`` so that it cannot pass itself off as part of
    the frame; then the gateway's screening findings. Every string in it, trusted or not, goes
    through :func:`neutralize`, so the result is safe to print.

    Args:
        content: a ``bcp_approval_request`` content, as a dict (from the wire or the database)
            or as the model. Missing or malformed parts are shown as missing, never raised.
        now: the time the expiry is counted from (default: the current time).
        width: the width to wrap to.

    Returns:
        Lines joined with newlines, no trailing newline.
    """
    data = _as_dict(content)
    now = now or _now()
    approval_id = _one_line(data.get("approval_id", "?"))
    kind = data.get("kind")
    controller = _one_line(data.get("controller", "?"))
    reader = _one_line(data.get("reader", "?"))
    lines = [f"== BCP APPROVAL REQUEST {approval_id} ".ljust(width, "=")]
    lines += _header(data, kind, controller, reader, now)
    lines += ["", *_spec_lines(data.get("spec"), width)]
    lines += ["", *_untrusted_block(data, kind, controller, reader, width)]
    lines += ["", *_anomaly_lines(data.get("anomalies"), width)]
    lines.append("=" * width)
    return "\n".join(lines)


def _untrusted_block(
    data: Mapping[str, Any], kind: Any, controller: str, reader: str, width: int
) -> list[str]:
    """The text to judge, framed: the untrusted-content notice, who wrote it, then each of its
    lines behind ``|`` between BEGIN and END markers."""
    text: Any
    if kind == "escalation":
        author = f"agent {controller} (controller)"
        text = {"escalation_justification": data.get("escalation_justification")}
    else:
        author = f"agent {reader} (reader, taint {_one_line(data.get('taint', 'high'))})"
        text = data.get("response")
    notice = data.get("notice") or UNTRUSTED_NOTICE
    lines = textwrap.wrap(
        neutralize(str(notice)), width, initial_indent="!! ", subsequent_indent="!! "
    )
    lines += _wrap(
        f"Written by {author}. Each line of it below starts with '|'.", width, "!! ", "!! "
    )
    lines.append("--- BEGIN UNTRUSTED TEXT ".ljust(width, "-"))
    lines += untrusted_lines(text, width)
    lines.append("--- END UNTRUSTED TEXT ".ljust(width, "-"))
    return lines


def _as_dict(content: Mapping[str, Any] | BcpApprovalRequest) -> dict[str, Any]:
    if isinstance(content, BaseModel):
        return content.model_dump(mode="json", exclude_none=True)
    return dict(content)


def _header(
    data: dict[str, Any], kind: Any, controller: str, reader: str, now: datetime
) -> list[str]:
    what = {
        "response": "response: a reader's answer waits for your decision",
        "escalation": "escalation: a controller asks to escalate to a Cat-3 summary",
    }.get(kind, _one_line(kind))
    rows = [("kind", what), ("channel", f"{controller} (controller) <- {reader} (reader)")]
    for key, label in (("query_id", "query"), ("subscription_id", "subscription")):
        if data.get(key) is not None:
            rows.append((label, _one_line(data[key])))
    if data.get("task_id") is not None:
        rows.append(("task", _one_line(data["task_id"])))
    if kind == "escalation" and data.get("from_category") is not None:
        rows.append(("escalates", f"from category {_one_line(data['from_category'])} to 3"))
    rows.append(("expires", _expiry(data.get("expires_at"), now)))
    return [f"{label:<13}{value}" for label, value in rows]


def _expiry(value: Any, now: datetime) -> str:
    moment = _parse_time(value)
    if moment is None:
        return "not given (the gateway's approval timeout applies)"
    seconds = int((moment - now).total_seconds())
    when = moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    if seconds <= 0:
        return f"{when} (EXPIRED {_duration(-seconds)} ago: counts as rejected)"
    return f"{when} (in {_duration(seconds)}; undecided by then counts as rejected)"


def _duration(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {seconds}s" if minutes else f"{seconds}s"


def _spec_lines(spec: Any, width: int) -> list[str]:
    if not isinstance(spec, Mapping):
        return ["What was asked: (no spec in the request)"]
    lines = [f"What was asked (category {_one_line(spec.get('category', '?'))}):"]
    for field in _items(spec.get("fields")):
        kind = field.get("type")
        if kind == "integer":
            kind = f"integer {_one_line(field.get('min'))}..{_one_line(field.get('max'))}"
        elif kind == "enum":
            kind = "one of " + " | ".join(_one_line(v) for v in field.get("values") or ())
        lines.append(f"  - {_one_line(field.get('name'))}: {_one_line(kind)}")
    for question in _items(spec.get("questions")):
        label = (
            f"  - {_one_line(question.get('id'))} ({_one_line(question.get('expected_format'))},"
            f" up to {_one_line(question.get('max_words'))} words): "
        )
        lines += _wrap(_one_line(question.get("question")), width, label, " " * 6)
    if spec.get("directive") is not None:
        lines += _wrap(_one_line(spec["directive"]), width, "  directive: ", " " * 13)
        lines.append(f"  up to {_one_line(spec.get('max_words'))} words")
    return lines


def _anomaly_lines(anomalies: Any, width: int) -> list[str]:
    found = list(_items(anomalies))
    if not found:
        return ["Anomalies: none found by the gateway's screening."]
    lines = ["Anomalies the gateway's screening found:"]
    for anomaly in found:
        where = f" in {_one_line(anomaly['field'])}" if anomaly.get("field") else ""
        label = f"  - {_one_line(anomaly.get('code'))}{where}: "
        lines += _wrap(_one_line(anomaly.get("detail", "")), width, label, " " * 6)
    return lines


def _items(value: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(value, list | tuple):
        yield from (item for item in value if isinstance(item, Mapping))


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    return textwrap.wrap(
        text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False
    ) or [first.rstrip()]


def _one_line(value: Any) -> str:
    return neutralize(str(value))


def _parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)  # 3.11 reads a trailing "Z"
        except ValueError:
            return None
    else:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _now() -> datetime:
    return datetime.now(UTC)


def _expired(value: Any, now: datetime | None = None) -> bool:
    moment = _parse_time(value)
    return moment is not None and moment <= (now or _now())


# The gateway's approvals table


@dataclass(frozen=True, slots=True)
class StoredApproval:
    """One row of the gateway's ``bcp_approvals`` table."""

    approval_id: str
    status: str
    """``pending``, ``approved``, ``rejected``, ``edited`` or ``expired``."""
    created_ts: str
    expires_ts: str | None
    request: dict[str, Any]
    """The ``bcp_approval_request`` content; show it with :func:`render_request`."""
    decided_by: str | None = None
    decided_ts: str | None = None
    decision: dict[str, Any] | None = None
    """The ``bcp_approval_decision`` content the gateway took."""

    def is_open(self, now: datetime | None = None) -> bool:
        """Whether it still waits for a decision: ``pending`` and not past its expiry."""
        return self.status == "pending" and not _expired(self.expires_ts, now)

    def to_dict(self) -> dict[str, Any]:
        """The row as a JSON-ready dict, the request and decision decoded."""
        return {
            "approval_id": self.approval_id,
            "status": self.status,
            "created_ts": self.created_ts,
            "expires_ts": self.expires_ts,
            "decided_by": self.decided_by,
            "decided_ts": self.decided_ts,
            "request": self.request,
            "decision": self.decision,
        }


def read_approvals(
    db: str | os.PathLike[str], *, open_only: bool = True, now: datetime | None = None
) -> list[StoredApproval]:
    """Read approvals from the gateway's database, oldest first.

    Args:
        db: the SQLite file the gateway writes (the activity log's).
        open_only: only those still waiting for a decision (see :meth:`StoredApproval.is_open`);
            ``False`` returns every approval with its final status.
        now: the time expiry is judged at (default: the current time).

    Returns:
        The approvals; none when the gateway has not created its table yet.

    Raises:
        FileNotFoundError: there is no such file.
    """
    with _connect(db) as conn:
        if conn is None:
            return []
        rows = conn.execute("SELECT * FROM bcp_approvals ORDER BY created_ts, approval_id")
        approvals = [_stored(row) for row in rows]
    return [a for a in approvals if a.is_open(now)] if open_only else approvals


def read_approval(db: str | os.PathLike[str], approval_id: str) -> StoredApproval | None:
    """Read one approval from the gateway's database; None if there is no such approval.

    Raises:
        FileNotFoundError: there is no such file.
    """
    with _connect(db) as conn:
        if conn is None:
            return None
        row = conn.execute(
            "SELECT * FROM bcp_approvals WHERE approval_id = ?", (approval_id,)
        ).fetchone()
        return None if row is None else _stored(row)


@contextlib.contextmanager
def _connect(db: str | os.PathLike[str]) -> Iterator[sqlite3.Connection | None]:
    """Open ``db`` read-only; yield None if it has no ``bcp_approvals`` view yet."""
    with read_only(db) as conn:
        # The gateway creates the view (over the activity log's approval rows) when it starts.
        yield conn if has_relation(conn, "bcp_approvals") else None


def _stored(row: sqlite3.Row) -> StoredApproval:
    return StoredApproval(
        approval_id=str(row["approval_id"]),
        status=str(row["status"]),
        created_ts=str(row["created_ts"]),
        expires_ts=row["expires_ts"],
        request=_json_object(row["request_json"]) or {},
        decided_by=row["decided_by"],
        decided_ts=row["decided_ts"],
        decision=_json_object(row["decision_json"]),
    )


def _json_object(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# What an approver typed, and what the gateway made of a decision


def edited_response(text: str, category: int) -> dict[str, Any]:
    """The replacement response an approver typed: a JSON object, or for a Cat-3 summary
    plain text too, which becomes ``{"summary": text}``.

    The gateway validates it again against the request's spec; this only gives it its shape.

    Raises:
        ValueError: ``text`` is empty, or not a JSON object where one is needed; the message
            says what to type.
    """
    if not text.strip():
        raise ValueError("the replacement response is empty")
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    if category == 3:
        return {"summary": text.strip()}
    raise ValueError('the replacement response must be a JSON object, e.g. {"q1": "answer"}')


def decision_refusal(db: str | os.PathLike[str], message_id: str) -> str | None:
    """Why the gateway did not take the decision sent as ``message_id``: ``"<code>: <detail>"``
    (a :class:`~schemas.bcp.DecisionRefusal`) from the bus's ``process_finish`` row for it,
    escaped; None when the log at ``db`` has no such row (yet) or cannot be read."""
    with contextlib.suppress(FileNotFoundError, ValueError, sqlite3.Error):
        rows = audit.query_rows(db, message_id=message_id, event="process_finish")
        for row in rows:
            if row.get("actor") == GATEWAY_ID and row.get("error"):
                return neutralize(str(row["error"]))
    return None
