"""Pushes: a reader's ``bcp_response`` under a controller's declared subscription.

A push must name a subscription the controller declared, keep within its rate limits and the
channel's budget, and validate against the subscription's spec; each refusal is a
``bcp_push_refused`` row. An accepted push waits for its grid point; then it is charged
(committed) and delivered, held for an offline controller, or held for a human's review; the
reader's verdict says which. On a
channel with screeners a valid Cat-2 or Cat-3 push is judged by them first (:mod:`.screens`),
one push per subscription at a time; its limits are checked again once they have decided.

A push is charged what it told the controller (:class:`~schemas.bcp.DeliveryBits`): what its
value carries (:attr:`~peers.gateway.validation.ValidationResult.value_bits`, and a flag
channel's codes), one bit that a push came at all, and the slot of the grid it was sent in,
counted from when the subscription allowed it (the previous push's grid point plus
``min_interval_s``, or the gateway's start; :mod:`..timing`). A push that does not fit the
budget left is refused ``budget_exhausted``, uncharged, once validated or as it would leave
(queries admitted meanwhile may have taken the budget): the budget changes on the grid only,
since a controller can probe it with queries it expects refused.
"""

from __future__ import annotations

from typing import Any

from bus.core.logevents import LogEvent
from schemas.agents import Channel, Subscription
from schemas.bcp import BcpResponse, DeliveryBits, QuerySpec, ReasonCode
from schemas.common import agent_id

from .. import timing
from ..bits import findings_bits
from ..events import Action, Commit, MessageReceived, Respond
from ..validation import ValidationResult, validate_response
from .approvals import Approvals
from .context import Context, Leaving, Refusal, raw_answer
from .frames import anomalies, codes_only, delivery
from .outbox import Outbox
from .outcomes import ANSWERED
from .screens import Screens
from .sealed import seal, sealed_charge

__all__ = ["Pushes"]


class Pushes:
    """Take readers' pushes under declared subscriptions."""

    def __init__(
        self, ctx: Context, approvals: Approvals, outbox: Outbox, screens: Screens
    ) -> None:
        self.ctx = ctx
        self.approvals = approvals
        self.outbox = outbox
        self.screens = screens

    def receive(
        self, event: MessageReceived, channel: Channel, response: BcpResponse
    ) -> list[Action]:
        """Check, validate and charge a push; deliver it or hold it; tell the reader; reply."""
        assert response.subscription_id is not None
        ref = {"subscription_id": response.subscription_id}
        try:
            subscription = self._check(channel, response)
        except Refusal as refusal:
            return self._refuse(event, channel, ref, refusal)
        spec = subscription.as_spec()
        result = validate_response(spec, response.response, anomaly_action=channel.anomaly_action)
        if self.screens.needed(channel, spec, result):
            if self.screens.busy(channel, **ref):
                # One push per subscription at a time: pushes accepted later would otherwise
                # pile up, each asking every screener, before the first one counts.
                detail = "an earlier push on this subscription is still being screened"
                return self._refuse(event, channel, ref, Refusal(ReasonCode.RATE_LIMITED, detail))

            def screened(final: ValidationResult) -> list[Action]:
                if final.accepted:
                    try:
                        self._check(channel, response)
                    except Refusal as refusal:
                        checked = self.ctx.validation(
                            channel, final, event.message_id, raw_answer(event), **ref
                        )
                        return [checked, *self._refuse(event, channel, ref, refusal)]
                return self._judged(event, channel, subscription, final)

            raw = response.response
            asked = self.screens.ask(channel, spec, raw, result, ref, event.message_id, screened)
            return [*asked, Respond(True, "screening")]
        return self._judged(event, channel, subscription, result)

    def _refuse(
        self, event: MessageReceived, channel: Channel, ref: dict[str, str], refusal: Refusal
    ) -> list[Action]:
        ctx = self.ctx
        # A subscription that does not exist is the whole story; a limit says which.
        unknown = refusal.reason == ReasonCode.SUBSCRIPTION_NOT_FOUND
        extra = {} if unknown else {"detail": refusal.detail}
        row = ctx.record(LogEvent.BCP_PUSH_REFUSED, channel, refusal.reason, **extra, **ref)
        return [
            row,
            *ctx.tell_reader(event, channel, ref, refusal.reason, refusal.detail),
            Respond(False, refusal.reason, refusal.detail),
        ]

    def _judged(
        self,
        event: MessageReceived,
        channel: Channel,
        subscription: Subscription,
        result: ValidationResult,
    ) -> list[Action]:
        """Carry the verdict on a push through: charge and deliver or hold it, or refuse it."""
        ctx, ref = self.ctx, {"subscription_id": subscription.id}
        checked = ctx.validation(channel, result, event.message_id, raw_answer(event), **ref)
        if result.accepted:
            return [checked, *self._accept(event, channel, subscription, result)]
        reason = ReasonCode.VALIDATION_FAILED
        return [
            checked,
            ctx.record(LogEvent.BCP_PUSH_REFUSED, channel, reason, **ref),
            *ctx.tell_reader(event, channel, ref, reason, result.detail(), result),
            Respond(False, reason, result.detail()),
        ]

    def _accept(
        self,
        event: MessageReceived,
        channel: Channel,
        subscription: Subscription,
        result: ValidationResult,
    ) -> list[Action]:
        ctx, sid, spec = self.ctx, subscription.id, subscription.as_spec()
        ref = {"subscription_id": sid}
        found = anomalies(result)
        slot = self._slot(channel, subscription)
        # A sealed field's text is not delivered: only its facts are charged.
        value = sealed_charge(spec, result.response or {}, result.value_bits)
        bits = DeliveryBits(
            value=value + self._codes_bits(channel, spec, found),
            outcome=ANSWERED,
            timing=slot.bits,
        )
        total = bits.value + bits.outcome + bits.timing
        if not ctx.state.ledger.fits(channel.key, total, channel.budget_bits):
            return self._refuse(event, channel, ref, self._over_budget(channel, total))
        # The next push's grid is laid from this one's grid point, which the controller sees,
        # not from this moment, which only the reader chose.
        ctx.state.rates.record((*channel.key, sid), slot.at)
        received = ctx.record(
            LogEvent.BCP_PUSH_RECEIVED, channel, "accepted", bits=total, subscription_id=sid
        )

        leaving = self._leaving(event, channel, subscription, bits)
        if result.approval_required:
            # Charged, and put before a human, at its grid point too.
            review = self._review(event, channel, subscription, result, bits, leaving)
            at_grid = self.outbox.at_grid(channel, slot.at, review)
            return [received, Commit(), *at_grid, Respond(True, "held_for_approval")]
        values, sealed = seal(ctx, channel, spec, result.response or {}, found, **ref)
        content = delivery(channel, spec, values, bits, found, **ref)

        def verdict(delivered: bool) -> list[Action]:
            if delivered:
                told = ctx.tell_reader(event, channel, ref, None, "accepted")
                return [*told, Respond(True, "delivered")]
            detail = f"valid; held until {agent_id(channel.controller)} connects"
            return [*ctx.tell_reader(event, channel, ref, None, detail), Respond(True, "held")]

        # Deliver first, so that the verdict the reader waits for says whether it was held.
        deliver = self.outbox.deliver(
            channel, "bcp_response_delivery", content, verdict, at=slot.at, leaving=leaving
        )
        return [received, Commit(), *sealed, *deliver]

    def _leaving(
        self,
        event: MessageReceived,
        channel: Channel,
        subscription: Subscription,
        bits: DeliveryBits,
    ) -> Leaving:
        """Return the push's charge as it leaves, on the grid (see :data:`~.context.Leaving`):
        queries admitted since it was validated may have taken the budget, and then it does
        not go."""
        total = bits.value + bits.outcome + bits.timing

        def leaving() -> tuple[bool, list[Action]]:
            if self.ctx.state.ledger.fits(channel.key, total, channel.budget_bits):
                return True, self._charge(channel, subscription, bits)
            refusal = self._over_budget(channel, total)
            return False, self._refuse(
                event, channel, {"subscription_id": subscription.id}, refusal
            )

        return leaving

    def _review(
        self,
        event: MessageReceived,
        channel: Channel,
        subscription: Subscription,
        result: ValidationResult,
        bits: DeliveryBits,
        leaving: Leaving,
    ) -> Leaving:
        """Return what charges a push held for review at its grid point, tells its reader,
        and then opens the approval."""
        ctx, spec = self.ctx, subscription.as_spec()
        ref = {"subscription_id": subscription.id}

        def review() -> list[Action]:
            return self.approvals.review(
                channel, spec, result, subscription=subscription, bits=bits.value, split=bits
            )

        def held_for_review() -> tuple[bool, list[Action]]:
            go, charged = leaving()
            if not go:
                return False, charged
            # The approval opens once the reader has its verdict (see answers.py).
            held = "valid; held for human approval"
            return True, [*charged, *ctx.tell_reader(event, channel, ref, None, held, then=review)]

        return held_for_review

    def _over_budget(self, channel: Channel, total: float) -> Refusal:
        left = self.ctx.state.ledger.left(channel.key, channel.budget_bits)
        detail = f"this push carries {total:.1f} bits; {left:.1f} left"
        return Refusal(ReasonCode.BUDGET_EXHAUSTED, detail)

    def _charge(
        self, channel: Channel, subscription: Subscription, bits: DeliveryBits
    ) -> list[Action]:
        """Charge an accepted push; its row, committed."""
        ctx, sid = self.ctx, subscription.id
        total = bits.value + bits.outcome + bits.timing
        ctx.state.ledger.charge(channel.key, total, cat2=False)
        split = bits.model_dump()
        return [
            ctx.charged(
                channel, total, subscription_id=sid, category=subscription.category, split=split
            ),
            Commit(),
        ]

    def _slot(self, channel: Channel, subscription: Subscription) -> timing.Release:
        """The grid slot of a push now, counted from when its subscription allowed it."""
        ctx = self.ctx
        last = ctx.state.rates.last((*channel.key, subscription.id))
        anchor = ctx.started if last is None else last + subscription.min_interval_s
        return timing.release(anchor, ctx.clock(), channel.delivery_quantum)

    @staticmethod
    def _codes_bits(channel: Channel, spec: QuerySpec, found: list[dict[str, Any]]) -> float:
        if channel.anomaly_action != "flag":
            return 0.0
        codes = [(f.get("field"), f["code"]) for f in codes_only(spec, found)]
        return findings_bits(spec, codes)

    def _check(self, channel: Channel, response: BcpResponse) -> Subscription:
        """Return the subscription ``response`` pushes on, within its limits; raise Refusal."""
        sid = str(response.subscription_id)
        subscription = channel.subscription(sid)
        if subscription is None or response.controller != channel.controller:
            detail = f"no subscription {sid!r} from {response.controller!r} to this reader"
            raise Refusal(ReasonCode.SUBSCRIPTION_NOT_FOUND, detail)
        ctx, key = self.ctx, (*channel.key, subscription.id)
        if not ctx.state.rates.allows(
            key,
            ctx.clock(),
            min_interval_s=subscription.min_interval_s,
            max_per_hour=subscription.max_per_hour,
        ):
            hourly = subscription.max_per_hour
            limit = f" and {hourly} per hour" if hourly is not None else ""
            raise Refusal(
                ReasonCode.RATE_LIMITED,
                f"at most one push per {subscription.min_interval_s:g}s{limit}",
            )
        if ctx.state.ledger.left(channel.key, channel.budget_bits) <= 0:
            raise Refusal(ReasonCode.BUDGET_EXHAUSTED, "no bits are left of the budget")
        return subscription
