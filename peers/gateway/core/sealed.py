"""Sealed values: answers a controller gets as a handle and facts, and forwards by handle.

A Cat-2 question, a Cat-3 spec or a subscription marked ``sealed: true`` is validated, screened,
charged and logged like any other, but the delivery holds, for each sealed field, a
:class:`~schemas.bcp.SealedValue` (``{"sealed": HANDLE, "format", "words", "bits",
"findings"}``) and never the text: :func:`seal` swaps them in and writes one ``bcp_sealed`` row
per value, committed before the delivery leaves. The text stays here, in
:attr:`~peers.gateway.state.GatewayState.sealed`, until the channel's ``sealed_ttl`` runs out.

The controller learns the facts, not the text, so the value is charged the facts
(:func:`sealed_charge`): ``log2(max_words + 1)`` bits for the word count; the format is the
spec's own, the findings are charged with a ``flag`` channel's codes, and the handle is random.

:class:`Forwards` takes a ``bcp_forward``: every ``{"$sealed": HANDLE}`` in its content must be a
handle issued to this controller on this channel and still alive, and the destination must match
the channel's ``sealed_to`` (a clientId pattern, or ``role:<name>``: a role the bus announced it
holding, see :mod:`.presence`) and be a human or an agent tainted at least as high as the text.
Then the message goes out with the text in place, marked untrusted, after a committed
``bcp_forwarded`` row (the handles, the destination, each value's SHA-256). Each refusal is a
``bcp_forward_refused`` row and a ``bcp_forward_result`` with its :class:`ReasonCode`.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from bus.core.logevents import LogEvent
from bus.core.topics import matches
from schemas.agents import SEALED_TO_ROLE, Channel
from schemas.bcp import (
    UNTRUSTED_NOTICE,
    BcpForward,
    BcpForwardResult,
    ExpectedFormat,
    QuerySpec,
    ReasonCode,
    SealedValue,
)
from schemas.common import TaintLevel, agent_id, step_down, taint_rank

from ..bits import facts_bits, value_bits
from ..events import Action, Commit, MessageReceived, Record, Respond, Send, Spawn
from ..state import Seal
from .context import GATEWAY_CLIENT_ID, Context, Refusal, channel_of, parse
from .frames import codes_only, iso, wire
from .presence import Presence

__all__ = ["FORWARD_TYPES", "HUMAN_PREFIXES", "Forwards", "seal", "sealed_charge"]

HUMAN_PREFIXES = frozenset({"tg", "human"})
"""clientId prefixes of people (a chat, an approver): they read a sealed text as data."""

FORWARD_TYPES = frozenset({"tg_reply", "tg_message"})
"""The message types a forward may arrive as: a chat's reply, an agent's message. Only these:
the gateway sends it as ``system:gateway``, and a controller must not speak for the gateway
with its own types (``bcp_approval_request`` to a human, ``bcp_query`` to a reader)."""

_REF_KEY = "$sealed"


def _limits(spec: QuerySpec) -> dict[str, tuple[int, str, ExpectedFormat | None]]:
    """``key -> (max_words, format, expected_format)`` for each sealed key of ``spec``."""
    keys = spec.sealed_keys()
    if spec.category == 3:
        return {"summary": (spec.max_words or 1, "summary", None)} if keys else {}
    return {
        q.id: (q.max_words, q.expected_format, q.expected_format)
        for q in spec.questions or ()
        if q.id in keys
    }


def sealed_charge(spec: QuerySpec, response: Mapping[str, Any], charge: float) -> float:
    """Return ``charge`` (what the answer carries) with each sealed text's bits replaced by
    its facts' bits: what the controller is charged for a delivery of ``response``."""
    for key, (max_words, _format, expected) in _limits(spec).items():
        text = response.get(key)
        if isinstance(text, str):
            charge += facts_bits(max_words) - value_bits(text, max_words, expected)
    return max(0.0, charge)


def seal(
    ctx: Context,
    channel: Channel,
    spec: QuerySpec,
    response: Mapping[str, Any],
    found: list[dict[str, Any]],
    **ref: str,
) -> tuple[dict[str, Any], list[Action]]:
    """Return ``response`` with each sealed field's text swapped for a handle and its facts,
    and the ``bcp_sealed`` rows (then a commit) to carry out before it is delivered.

    Nothing changes for a spec with no sealed field.
    """
    limits = _limits(spec)
    if not limits:
        return dict(response), []
    _prune(ctx)
    codes = codes_only(spec, found) if found and channel.anomaly_action == "flag" else []
    sealed: dict[str, Any] = dict(response)
    rows: list[Action] = []
    for key, (max_words, fmt, _expected) in limits.items():
        text = response.get(key)
        if isinstance(text, str):
            findings = tuple(c["code"] for c in codes if c.get("field") == key)
            value, row = _seal_one(ctx, channel, key, text, (max_words, fmt, findings), ref)
            sealed[key] = wire(value)
            rows.append(row)
    return sealed, [*rows, Commit()]


def _seal_one(
    ctx: Context,
    channel: Channel,
    key: str,
    text: str,
    facts: tuple[int, str, tuple[str, ...]],
    ref: Mapping[str, str],
) -> tuple[SealedValue, Action]:
    """Keep ``text`` under a new handle; return its sealed value and its ``bcp_sealed`` row."""
    max_words, fmt, findings = facts
    handle = f"sh-{secrets.token_urlsafe(32)}"  # 256 random bits: unguessable
    expires_at = ctx.clock() + channel.sealed_ttl
    taint = step_down(channel.reader_taint)
    where = {**ref, "field": key}
    kept = Seal(handle, channel.controller, channel.reader, text, taint, expires_at, where)
    ctx.state.sealed[handle] = kept
    value = SealedValue.model_validate(
        {
            "sealed": handle,
            "format": fmt,
            "words": len(text.split()),
            "bits": round(facts_bits(max_words), 3),
            "findings": findings,
        }
    )
    row = ctx.record(
        LogEvent.BCP_SEALED,
        channel,
        "sealed",
        handle=handle,
        field=key,
        expires_at=iso(expires_at),
        sha256=hashlib.sha256(text.encode()).hexdigest(),
        text=ctx.content(text),
        taint=taint,
        **ref,
    )
    return value, row


def _prune(ctx: Context) -> None:
    now = ctx.clock()
    for handle in [h for h, s in ctx.state.sealed.items() if s.expires_at <= now]:
        del ctx.state.sealed[handle]


class Forwards:
    """Take controllers' ``bcp_forward``: check each handle and the destination, then send."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.presence = Presence()
        """Connected peers' roles, for ``role:<name>`` entries of ``sealed_to``."""

    def receive(self, event: MessageReceived) -> list[Action]:
        """Forward the message, or refuse it; the controller gets a ``bcp_forward_result``."""
        forward_id = event.content.get("forward_id")
        to = str(event.content.get("to", ""))[:128]
        try:
            channel = channel_of(self.ctx.channels, event, sender_is="controller")
            forward = parse(BcpForward, event.content, ReasonCode.INVALID_MESSAGE)
            if forward.type not in FORWARD_TYPES:
                allowed = ", ".join(sorted(FORWARD_TYPES))
                raise Refusal(ReasonCode.FORWARD_FORBIDDEN, f"a forward is one of: {allowed}")
            seals = [self._check(channel, handle) for handle in _handles(forward.content)]
            if not seals:
                raise Refusal(ReasonCode.INVALID_MESSAGE, 'content has no {"$sealed": HANDLE}')
            self._check_destination(channel, forward.to, seals)
        except Refusal as refusal:
            return self._refuse(event, forward_id, to, refusal)
        return self._send(event, channel, forward, seals)

    def _check(self, channel: Channel, handle: str) -> Seal:
        kept = self.ctx.state.sealed.get(handle)
        if kept is None:
            raise Refusal(ReasonCode.SEALED_UNKNOWN, "no sealed value has this handle")
        if (kept.controller, kept.reader) != channel.key:
            raise Refusal(
                ReasonCode.SEALED_NOT_YOURS,
                f"the handle was issued to another controller or channel, not {channel.topic}",
            )
        if kept.expires_at <= self.ctx.clock():
            raise Refusal(
                ReasonCode.SEALED_EXPIRED, f"the handle expired at {iso(kept.expires_at)}"
            )
        return kept

    def _check_destination(self, channel: Channel, to: str, seals: list[Seal]) -> None:
        for entries in channel.sealed_to:
            self._check_allowed(channel, to, entries)
        prefix, _, name = to.partition(":")
        if prefix in HUMAN_PREFIXES:
            return
        if prefix != "agent":
            raise Refusal(
                ReasonCode.FORWARD_FORBIDDEN, "sealed values go to humans and agents only"
            )
        taint: TaintLevel = dict(channel.taints).get(name, "none")
        needed = max((s.taint for s in seals), key=taint_rank)
        if taint == "none" or taint_rank(taint) < taint_rank(needed):
            raise Refusal(
                ReasonCode.FORWARD_UNTAINTED,
                f"{to} is tainted {taint}; the sealed text is {needed}",
            )

    def _check_allowed(self, channel: Channel, to: str, entries: tuple[str, ...]) -> None:
        """Refuse unless ``to`` matches a clientId pattern of ``entries`` or holds a role one
        names; a role entry is no match while the bus has not announced ``to``'s roles."""
        roles = self.presence.roles_of(to)
        wanted = {e.removeprefix(SEALED_TO_ROLE) for e in entries if e.startswith(SEALED_TO_ROLE)}
        if any(matches(e, to) for e in entries if not e.startswith(SEALED_TO_ROLE)):
            return
        if roles is not None and wanted & roles:
            return
        if wanted and roles is None:
            raise Refusal(
                ReasonCode.FORWARD_ROLE_UNKNOWN,
                f"{channel.topic}'s sealed_to allows {to} only by role, and the bus has not "
                f"announced {to}'s roles (not connected?)",
            )
        raise Refusal(
            ReasonCode.FORWARD_FORBIDDEN, f"{to} matches none of {channel.topic}'s sealed_to"
        )

    def _send(
        self, event: MessageReceived, channel: Channel, forward: BcpForward, seals: list[Seal]
    ) -> list[Action]:
        texts = {s.handle: s.text for s in seals}
        content = {
            **_substitute(forward.content, texts),
            # Marked as a delivery is: the text is a tainted reader's, to be read as data.
            "untrusted": True,
            "notice": UNTRUSTED_NOTICE,
            "provenance": {"channel": channel.topic, "reader": channel.reader},
        }
        row = self.ctx.record(
            LogEvent.BCP_FORWARDED,
            channel,
            "forwarded",
            message_id=event.message_id,
            forward_id=forward.forward_id,
            to=forward.to,
            type=forward.type,
            handles=[s.handle for s in seals],
            sha256={s.handle: hashlib.sha256(s.text.encode()).hexdigest() for s in seals},
        )

        def told(detail: str) -> Send:
            result = BcpForwardResult(
                forward_id=forward.forward_id, success=True, to=forward.to, detail=detail
            )
            return Send(agent_id(channel.controller), "bcp_forward_result", result)

        if forward.to.partition(":")[0] not in HUMAN_PREFIXES:
            # A tainted agent's processMessage answer must not choose what the controller reads
            # back, nor when: it is handed the text in the background, and the controller is
            # told only that (how it went is the bus's process_finish row).
            handed = Send(forward.to, forward.type, content)
            return [
                row,
                Commit(),
                told("handed over"),
                Respond(True, "forwarded"),
                Spawn((handed,)),
            ]

        def sent(delivered_to: int) -> list[Action]:
            if delivered_to:
                return [told("forwarded"), Respond(True, "forwarded")]
            refusal = Refusal(ReasonCode.FORWARD_UNDELIVERED, f"{forward.to} took nothing")
            return self._refuse(event, forward.forward_id, forward.to, refusal)

        send = self.ctx.send_then(forward.to, forward.type, content, sent)
        return [row, Commit(), send]

    def _refuse(
        self, event: MessageReceived, forward_id: Any, to: str, refusal: Refusal
    ) -> list[Action]:
        row = Record(
            LogEvent.BCP_FORWARD_REFUSED,
            actor=GATEWAY_CLIENT_ID,
            topic=event.topic,
            status=refusal.reason,
            payload={
                "channel": event.topic,
                "forward_id": str(forward_id)[:128] if forward_id is not None else None,
                "to": to,
                "detail": refusal.detail,
            },
            message_id=event.message_id,
        )
        actions: list[Action] = [row, Commit()]
        controller = event.sender.partition(":")[2]
        if event.sender.startswith("agent:") and isinstance(forward_id, str):
            try:
                result = BcpForwardResult(
                    forward_id=forward_id,
                    success=False,
                    to=to,
                    error=ReasonCode(refusal.reason),
                    detail=refusal.detail,
                )
            except ValueError:
                pass  # An id that breaks its pattern is not echoed (schemas/json).
            else:
                actions.append(Send(agent_id(controller), "bcp_forward_result", result))
        return [*actions, Respond(False, refusal.reason, refusal.detail)]


def _handles(value: Any) -> list[str]:
    """Every handle a ``{"$sealed": HANDLE}`` inside ``value`` names, once, in order."""
    found: list[str] = []
    _walk(value, lambda handle: found.append(handle) if handle not in found else None)
    return found


def _walk(value: Any, visit: Callable[[str], None]) -> None:
    if isinstance(value, dict):
        if _REF_KEY in value:
            if len(value) != 1 or not isinstance(value[_REF_KEY], str):
                raise Refusal(ReasonCode.INVALID_MESSAGE, 'a sealed value is {"$sealed": HANDLE}')
            visit(value[_REF_KEY])
            return
        for item in value.values():
            _walk(item, visit)
    elif isinstance(value, list):
        for item in value:
            _walk(item, visit)


def _substitute(value: Any, texts: Mapping[str, str]) -> Any:
    """``value`` with every ``{"$sealed": HANDLE}`` replaced by its text."""
    if isinstance(value, dict):
        if _REF_KEY in value:
            return texts[value[_REF_KEY]]
        return {key: _substitute(item, texts) for key, item in value.items()}
    if isinstance(value, list):
        return [_substitute(item, texts) for item in value]
    return value
