"""Deliveries to controllers, released on their channel's grid, held while a controller is
offline, flushed when it joins.

A delivery with a grid point (``at``, see :mod:`..timing`) waits for it first: the core sets a
``("release", controller, delivery_id)`` timer, and when any of a controller's release timers
fires every delivery due by then leaves, earliest first, so that two deliveries due at one grid
point keep their order.

A delivery that finds its controller away, or finds earlier ones still held, becomes a
``bcp_held`` row (committed before it is kept) and waits ``outbox_ttl`` seconds; when the
controller joins, the outbox is sent in order and each delivery is logged as it lands. A held
push that expires tells its reader ``controller_unavailable``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from typing import Any

from bus.core.logevents import LogEvent
from schemas.agents import Channel
from schemas.bcp import BcpValidationResult, ReasonCode
from schemas.common import agent_id

from ..events import Action, CancelTimer, Commit, Send, SetTimer, Spawn
from ..state import Held
from .context import Context, Leaving, Release
from .frames import iso

__all__ = ["Outbox"]


class Outbox:
    """Deliver to controllers, or hold for them."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def deliver(
        self,
        channel: Channel,
        message_type: str,
        content: Mapping[str, Any],
        then: Callable[[bool], list[Action]] | None = None,
        *,
        at: float | None = None,
        leaving: Leaving | None = None,
    ) -> list[Action]:
        """Send to the channel's controller at ``at`` (a grid point), or hold it while the
        controller is away.

        ``leaving`` runs the moment it leaves and may drop it (:data:`~.context.Leaving`);
        ``then`` gets whether it was delivered when it left, and its actions follow. ``None``
        for ``at``, or a time already past: now.
        """
        # One id for this message however often it is sent (now, or from the outbox later), so
        # that a controller that also fetches the first copy by epoch can drop the repeat.
        content = {**content, "delivery_id": f"d-{secrets.token_hex(8)}"}
        now = self.ctx.clock()
        if at is None or at <= now:
            return self._leave(Release(now, channel, message_type, content, then, leaving))
        queue = self.ctx.releases.setdefault(channel.controller, [])
        # Earliest first; one due at the same point as another goes after it.
        index = next((i for i, r in enumerate(queue) if r.at > at), len(queue))
        queue.insert(index, Release(at, channel, message_type, content, then, leaving))
        key = ("release", channel.controller, content["delivery_id"])
        return [SetTimer(key, at - now)]

    def at_grid(self, channel: Channel, at: float, leaving: Leaving) -> list[Action]:
        """Run ``leaving`` at the grid point ``at``, in turn with the controller's deliveries,
        sending nothing (a push held for review is charged and put before a human then)."""
        return self.deliver(channel, "", {}, at=at, leaving=leaving)

    def release(self, controller: str, delivery_id: str) -> list[Action]:
        """Send the delivery whose timer fired, every one queued before it, and every other one
        due by now, earliest first; when more than one is due, each in a
        :class:`~..events.Spawn` of its own."""
        queue = self.ctx.releases.get(controller, [])
        ids = [r.content["delivery_id"] for r in queue]
        upto = ids.index(delivery_id) + 1 if delivery_id in ids else 0
        now = self.ctx.clock()
        actions: list[Action] = []
        runs: list[list[Action]] = []
        while queue and (upto > 0 or queue[0].at <= now + 1e-6):
            upto -= 1
            due = queue.pop(0)
            actions.append(CancelTimer(("release", controller, due.content["delivery_id"])))
            runs.append(self._leave(due))
        if not queue:
            self.ctx.releases.pop(controller, None)
        if len(runs) == 1:
            return [*actions, *runs[0]]  # The timer's own run carries it: no task more.
        # Each on its own, started in order (their frames leave in order): carried out one after
        # another, the last of a grid point's deliveries would wait for every one before it to
        # be answered by the bus and logged, and leave that much off the grid.
        return [*actions, *(Spawn(tuple(run)) for run in runs)]

    def _leave(self, due: Release) -> list[Action]:
        go, first = due.leaving() if due.leaving else (True, [])
        if not go or not due.message_type:
            return first  # Dropped as it would leave, or nothing to send (at_grid).
        return [*first, *self._now(due.channel, due.message_type, due.content, due.then)]

    def _now(
        self,
        channel: Channel,
        message_type: str,
        content: Mapping[str, Any],
        then: Callable[[bool], list[Action]] | None,
    ) -> list[Action]:
        after = then or _nothing
        controller = channel.controller
        if self.ctx.outbox.get(controller):
            # Keep the order: nothing overtakes what is already held.
            return [*self.hold(channel, message_type, content), *after(False)]

        def sent(delivered_to: int) -> list[Action]:
            if not delivered_to:
                return [*self.hold(channel, message_type, content), *after(False)]
            if message_type != "bcp_response_delivery":
                return after(True)
            return [self.ctx.delivered(channel, content), Commit(), *after(True)]

        return [self.ctx.send_then(agent_id(controller), message_type, content, sent)]

    def hold(self, channel: Channel, message_type: str, content: Mapping[str, Any]) -> list[Action]:
        """Keep a delivery for its offline controller, after a committed ``bcp_held`` row."""
        held = Held(
            hold_id=f"hold-{secrets.token_hex(6)}",
            controller=channel.controller,
            content={"type": message_type, "content": dict(content)},
            expires_at=self.ctx.clock() + self.ctx.settings.outbox_ttl,
            reader=channel.reader,
        )
        row = self.ctx.record(
            LogEvent.BCP_HELD,
            channel,
            "held",
            hold_id=held.hold_id,
            held=held.content,
            expires_at=iso(held.expires_at),
            query_id=content.get("query_id"),
            subscription_id=content.get("subscription_id"),
        )
        return [row, Commit(), *self.keep(held)]

    def keep(self, held: Held) -> list[Action]:
        """Put ``held`` in its controller's outbox; return the timer for its expiry."""
        self.ctx.outbox.setdefault(held.controller, []).append(held)
        delay = max(0.0, held.expires_at - self.ctx.clock())
        return [SetTimer(("held", held.controller, held.hold_id), delay)]

    def expire(self, controller: str, hold_id: str) -> list[Action]:
        """Drop a held delivery whose time ran out; tell the reader of a push."""
        items = self.ctx.outbox.get(controller, [])
        held = next((h for h in items if h.hold_id == hold_id), None)
        if held is None:
            return []
        items.remove(held)
        channel = self.ctx.channels.get((held.controller, held.reader))
        if channel is None:
            return []
        inner = held.content["content"]
        row = self.ctx.record(
            LogEvent.BCP_EXPIRED,
            channel,
            ReasonCode.CONTROLLER_UNAVAILABLE,
            hold_id=held.hold_id,
            query_id=inner.get("query_id"),
            subscription_id=inner.get("subscription_id"),
        )
        actions: list[Action] = [row, Commit()]
        if "subscription_id" in inner:
            verdict = BcpValidationResult(
                subscription_id=inner["subscription_id"],
                success=False,
                error=ReasonCode.CONTROLLER_UNAVAILABLE,
                detail=f"{agent_id(held.controller)} stayed offline; the push expired",
            )
            actions.append(Send(agent_id(held.reader), "bcp_validation_result", verdict))
        return actions

    def flush(self, controller: str) -> list[Action]:
        """Send the controller's held deliveries in order; stop at the first that fails."""
        items = self.ctx.outbox.get(controller)
        if not items:
            return []
        held = items[0]
        inner = held.content["content"]

        def sent(delivered_to: int) -> list[Action]:
            if not delivered_to:
                return []
            if held not in items:
                return self.flush(controller)  # It expired while the send was under way.
            items.remove(held)
            actions: list[Action] = [CancelTimer(("held", controller, held.hold_id))]
            channel = self.ctx.channels.get((controller, held.reader))
            if channel is not None:
                actions += [self.ctx.delivered(channel, inner, hold_id=held.hold_id), Commit()]
            return [*actions, *self.flush(controller)]

        return [self.ctx.send_then(agent_id(controller), held.content["type"], inner, sent)]


def _nothing(_delivered: bool) -> list[Action]:
    return []
