"""A decision taken in the console: the same message, the same checks, the same rows as
``bcpbus approve``.

The console sends the ``bcp_approval_decision`` as the signed-in approver, with the token the
person signed in with: :meth:`bus.server.Bus.route_for_token` finds the peer as the HTTP binding
does for ``POST /v1/messages``, and :meth:`bus.server.Bus.handle` carries out the
``sendMessage``. So the bus's policy refuses a peer that may not decide (an auditor: -32602 and
a ``refused`` row, answered 403), the gateway validates an edit again and takes the first
decision only, and the log holds the rows a decision from ``bcpbus approve`` leaves, with the
approver as their actor. Nothing is taken on the console's word: it never decides itself.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from bus.core.errors import BusError
from bus.core.protocol import Request
from bus.server import Bus
from schemas.bcp import BcpApprovalDecision, DecisionRefusal
from schemas.bus import Envelope, SendMessageParams
from schemas.common import APPROVAL_TOPIC, timestamp

from ..approver import Decision, decision_refusal

__all__ = ["Outcome", "send_decision"]

_DONE = {"approve": "approved", "reject": "rejected", "edit": "edited"}


@dataclass(frozen=True)
class Outcome:
    """What became of a decision: taken or not, and a line that says so to the person."""

    taken: bool
    text: str


async def send_decision(
    bus: Bus,
    token: str,
    approval_id: str,
    decision: Decision,
    *,
    edited: dict[str, Any] | None = None,
    reason: str | None = None,
    address: str,
) -> Outcome:
    """Send a decision to the gateway as the peer ``token`` belongs to; say what it made of it.

    Args:
        address: the browser's address, for the ``auth_failed`` row of a token no longer valid.

    Raises:
        BusError: the bus refused the message: the token is no longer valid
            (:class:`~bus.core.errors.AuthenticationFailed`), the peer may not decide
            (:class:`~bus.core.errors.Forbidden`), or the bus is closing.
    """
    try:
        content = BcpApprovalDecision(
            approval_id=approval_id, decision=decision, edited_response=edited, reason=reason
        )
    except ValidationError as exc:
        problem = "; ".join(error["msg"] for error in exc.errors())
        return Outcome(False, f"not sent: the decision is malformed: {problem}")
    rpc_id = f"console-{uuid.uuid4().hex[:16]}"
    route = await bus.route_for_token(token, Request(rpc_id, "sendMessage", None), address=address)
    message_id = f"decision-{uuid.uuid4().hex}"
    params = SendMessageParams(
        topic=APPROVAL_TOPIC,
        payload=Envelope.model_validate(
            {
                "messageId": message_id,
                "type": "bcp_approval_decision",
                "from": route.client_id,
                "timestamp": timestamp(),
                "content": content.model_dump(mode="json", exclude_none=True),
            }
        ),
    )
    request = Request(
        rpc_id, "sendMessage", params.model_dump(mode="json", by_alias=True, exclude_none=True)
    )
    result = await bus.handle(route, request)
    if int(result.get("deliveredTo", 0)) >= 1:
        return Outcome(True, f"{_DONE[decision]} {approval_id}: the gateway took the decision")
    return Outcome(False, await _why(bus, approval_id, message_id))


async def _why(bus: Bus, approval_id: str, message_id: str) -> str:
    """The line for a decision the gateway did not take, from its ``process_finish`` row."""
    try:
        await bus.log.commit()
    except BusError:
        pass  # the row may be there anyway; if not, the generic line below says what to check
    why = await asyncio.to_thread(decision_refusal, bus.log.path, message_id)
    code, _, detail = (why or "").partition(": ")
    if code == DecisionRefusal.ALREADY_DECIDED and detail:
        return f"{detail}; the gateway did not take this decision ({code})"
    if why is None:
        why = "it is unknown, already decided or expired, or the edit failed validation"
    return f"the gateway did not take the decision on {approval_id}: {why}"
