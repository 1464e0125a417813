"""The gateway's decisions, sans I/O: events in, actions out.

Nothing here awaits or touches a socket or the log. :meth:`GatewayCore.handle` takes an
:data:`~peers.gateway.events.Event` (a message received, a timer fired, a send's outcome, a
peer joining) and returns the actions the shell must carry out in order (see
:mod:`peers.gateway.events`). The flows live in parts over one shared :class:`Context`, each
importing only the ones below it::

    frames    the frames it sends, built through their schemas models
    context   shared state, refusals, row builders
    outcomes  what each outcome of a query costs
    outbox    deliveries to controllers, released on a grid, held while they are offline
    queries   admission, asking the reader, failure, expiry, completion
    approvals escalations and reviews, decisions, expiry
    screens   valid answers judged by the channel's screener peers
    answers   a reader's answers, with retries
    pushes    a reader's pushes, with rate limits
    sealed    sealed values: handles swapped in for text, and forwards by handle
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from bus.core.digest import LogContent
from bus.core.logevents import LogEvent
from schemas.agents import Channel
from schemas.bcp import ActiveSubscription, BcpResponse, BcpSubscriptionsActive, ReasonCode
from schemas.common import BUS_CLIENT_ID, agent_id

from ..events import (
    Action,
    Commit,
    Event,
    MessageReceived,
    PeerJoined,
    PeerLeft,
    Respond,
    Send,
    Sent,
    Spawn,
    TimerFired,
)
from ..state import ApprovalStatus, ChannelKey, Decided, GatewayState, Orphans
from .answers import Answers
from .approvals import Approvals
from .context import (
    APPROVAL_TOPIC,
    GATEWAY_CLIENT_ID,
    Context,
    Refusal,
    Settings,
    channel_of,
    parse,
)
from .frames import iso
from .outbox import Outbox
from .pushes import Pushes
from .queries import Admitted, Queries, Refused
from .screens import Screens
from .sealed import Forwards

__all__ = [
    "APPROVAL_TOPIC",
    "GATEWAY_CLIENT_ID",
    "Admitted",
    "GatewayCore",
    "Refusal",
    "Refused",
    "Settings",
    "channel_of",
    "parse",
]


class GatewayCore:
    """The gateway's decisions over its channels and :class:`GatewayState`.

    Args:
        channels: the channels from the agent definitions, by ``(controller, reader)``.
        state: what the gateway starts from (see :func:`peers.gateway.restore.load_state`).
        settings: expiry, retries, approval and outbox timeouts.
        clock: wall-clock seconds.
        log_content: what the rows keep of questions, answers and values delivered: ``full``,
            or their SHA-256 (``digest``), as the bus does for envelopes.
    """

    def __init__(
        self,
        channels: Mapping[ChannelKey, Channel],
        state: GatewayState,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        log_content: LogContent = "full",
    ) -> None:
        self.ctx = Context(channels, state, settings, clock, log_content)
        self.outbox = Outbox(self.ctx)
        self.queries = Queries(self.ctx, self.outbox)
        self.approvals = Approvals(self.ctx, self.queries, self.outbox)
        self.screens = Screens(self.ctx)
        self.answers = Answers(self.ctx, self.queries, self.approvals, self.screens)
        self.pushes = Pushes(self.ctx, self.approvals, self.outbox, self.screens)
        self.forwards = Forwards(self.ctx)

    @property
    def channels(self) -> Mapping[ChannelKey, Channel]:
        """The channels, by ``(controller, reader)``."""
        return self.ctx.channels

    @property
    def state(self) -> GatewayState:
        """What a restart carries over: budgets, tasks, rates, used ids, decisions."""
        return self.ctx.state

    def adopt(self, state: GatewayState) -> list[Action]:
        """Start from ``state``; return the timers of its held deliveries. Before :meth:`start`."""
        self.ctx.state = state
        return [action for held in state.held for action in self.outbox.keep(held)]

    def use_channels(self, channels: Mapping[ChannelKey, Channel]) -> list[Action]:
        """Put reloaded channels in force; return the announcements to readers whose active
        subscriptions changed.

        Queries and approvals in flight keep the channel they were admitted on; new ones are
        checked against ``channels``. Budgets carry over: a reload is not a budget reset.
        """
        old = self.ctx.channels
        self.ctx.channels = channels
        readers = {reader for _c, reader in (*old, *channels)}
        return [
            Spawn((self._announce(reader),))
            for reader in sorted(readers)
            if _active(old, reader) != _active(channels, reader)
        ]

    def reset_budget(self, channel: ChannelKey) -> None:
        """Start a new budget session for ``channel`` (a ``bcp_budget_reset`` row was written)."""
        self.ctx.state.ledger.reset(channel)

    def start(self) -> list[Action]:
        """Return what the gateway does once connected: announce subscriptions, flush outboxes."""
        readers = sorted({reader for _c, reader in self.channels})
        return [
            *(self._announce(reader) for reader in readers),
            *(a for controller in list(self.ctx.outbox) for a in self.outbox.flush(controller)),
        ]

    def settle(self, orphans: Orphans) -> list[Action]:
        """Fail what was in flight when the gateway last stopped (see :mod:`..restore`).

        Each orphaned approval is logged as expired and each orphaned query ends in
        ``bcp_query_failed`` (``timeout``) to its controller, held if it is offline.
        """
        ctx = self.ctx
        actions: list[Action] = []
        reason = "the gateway restarted"
        for controller, reader, approval_id in orphans.approvals:
            channel = self.channels[(controller, reader)]
            decided = Decided(ApprovalStatus.EXPIRED, GATEWAY_CLIENT_ID, iso(ctx.clock()), reason)
            ctx.state.decided.remember(approval_id, decided)
            actions.append(
                ctx.record(
                    LogEvent.BCP_APPROVAL_DECIDED,
                    channel,
                    ApprovalStatus.EXPIRED,
                    approval_id=approval_id,
                    reason=reason,
                )
            )
        detail = "the gateway restarted before the query was answered"
        for controller, reader, query_id in orphans.queries:
            query = self.queries.orphan(self.channels[(controller, reader)], query_id)
            actions += self.queries.fail(query, ReasonCode.TIMEOUT, detail)
        return [*actions, Commit()]

    def handle(self, event: Event) -> list[Action]:
        """Return what to do about ``event``, in order; a :class:`Respond` is the reply."""
        match event:
            case Sent():
                return self.ctx.sent(event)
            case TimerFired(key=("query", controller, query_id)):
                return self.queries.expire(controller, query_id)
            case TimerFired(key=("approval", approval_id)):
                return self.approvals.expire(approval_id)
            case TimerFired(key=("held", controller, hold_id)):
                return self.outbox.expire(controller, hold_id)
            case TimerFired(key=("release", controller, delivery_id)):
                return self.outbox.release(controller, delivery_id)
            case TimerFired(key=("screen", screen_id)):
                return self.screens.expire(screen_id)
            case PeerJoined():
                return self._joined(event)
            case PeerLeft():
                return self._left(event)
            case MessageReceived(type="bcp_query_request"):
                return self._query_request(event)
            case MessageReceived(type="bcp_response"):
                return self._response(event)
            case MessageReceived(type="bcp_approval_decision"):
                return self.approvals.receive_decision(event)
            case MessageReceived(type="bcp_screen_verdict"):
                return self.screens.receive(event)
            case MessageReceived(type="bcp_forward"):
                return self.forwards.receive(event)
            case _:
                return [Respond(True, "ignored")]

    def _query_request(self, event: MessageReceived) -> list[Action]:
        admitted = self.queries.check(event)
        if isinstance(admitted, Refused):
            return list(admitted.actions)
        query = self.queries.open(admitted)
        if admitted.escalation:
            held = Respond(True, "accepted", "escalation held for a human's approval")
            return [*self.approvals.escalate(query, admitted.request), held]
        return self.queries.ask_reader(query, event.message_id)

    def _response(self, event: MessageReceived) -> list[Action]:
        channel: Channel | None = None
        content = event.content
        ref = {
            "query_id": content.get("query_id"),
            "subscription_id": content.get("subscription_id"),
        }
        try:
            channel = channel_of(self.channels, event, sender_is="reader")
            response = parse(BcpResponse, content, ReasonCode.INVALID_MESSAGE)
        except Refusal as refusal:
            return [
                *self.ctx.tell_reader(event, channel, ref, refusal.reason, refusal.detail),
                Respond(False, refusal.reason, refusal.detail),
            ]
        if response.subscription_id is not None:
            return self.pushes.receive(event, channel, response)
        assert response.query_id is not None  # BcpResponse requires one of the two
        return self.answers.receive(event, channel, response.query_id, response.response)

    def _joined(self, event: PeerJoined) -> list[Action]:
        if event.sender != BUS_CLIENT_ID:
            return [Respond(False, "ignored", "presence comes from the bus only")]
        self.forwards.presence.joined(event.client_id, event.roles)
        prefix, _, name = event.client_id.partition(":")
        work: list[Action] = []
        if prefix == "agent" and name in {reader for _c, reader in self.channels}:
            work.append(Spawn((self._announce(name),)))
        if prefix == "agent" and name in self.ctx.outbox:
            work.append(Spawn(tuple(self.outbox.flush(name))))
        if prefix == "human":
            work += [Spawn((send,)) for send in self.approvals.resend(event.client_id)]
        return [*work, Respond(True)]

    def _left(self, event: PeerLeft) -> list[Action]:
        if event.sender != BUS_CLIENT_ID:
            return [Respond(False, "ignored", "presence comes from the bus only")]
        self.forwards.presence.left(event.client_id)  # Nothing else waits on a peer that left.
        return [Respond(True)]

    def _announce(self, reader: str) -> Send:
        active = BcpSubscriptionsActive(subscriptions=_active(self.channels, reader))
        return Send(agent_id(reader), "bcp_subscriptions_active", active)


def _active(channels: Mapping[ChannelKey, Channel], reader: str) -> tuple[ActiveSubscription, ...]:
    return tuple(
        entry
        for (_c, r), channel in sorted(channels.items())
        if r == reader
        for entry in channel.active_subscriptions()
    )
