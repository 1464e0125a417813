"""The BCP gateway: the one peer that reads what readers write.

It connects to the bus as ``system:gateway`` like any peer, under the same authentication,
policy and activity log, subscribes to ``bcp:*``, ``system:presence`` and ``system:approval``,
and runs every BCP flow:

- a controller's ``bcp_query_request`` is checked (channel, sender, category, spec, budget,
  Cat-2 limit, escalation) and either refused at once with ``bcp_query_failed`` or charged and
  passed to the reader as ``bcp_query``;
- a reader's ``bcp_response`` is validated and normalized; the reader learns the verdict in
  ``bcp_validation_result`` and may retry; a valid answer reaches the controller as
  ``bcp_response_delivery``, after a human's approval for Cat-3 and for answers under review;
- a reader's push (``bcp_response`` with ``subscription_id``) is validated against the
  controller's declared subscription, rate-limited and charged to the same budget;
- deliveries to a controller that is offline are held and sent when it joins, or expire;
- on a channel that names screeners, a valid Cat-2 or Cat-3 answer or push is sent to each as a
  ``bcp_screen_request`` and waits for their ``bcp_screen_verdict`` (on ``system:gateway``) or
  ``screener_timeout`` before it goes on.

Every decision is an activity-log row, committed before the message it allows is sent. The
decisions are made sans I/O by :class:`~peers.gateway.core.GatewayCore`; this class is its
shell: it turns messages, timers and send outcomes into events and carries out the actions
the core returns (see :mod:`peers.gateway.events`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from bus.core.errors import BusError
from bus.log.activity import ActivityLog
from bus.ops.config import LogContent
from peers.client import ConnectionEvent, Disconnected, Message, Peer, Reconnected, Reply
from peers.errors import PeerTimeout, RequestRefused
from schemas.agents import Channel
from schemas.bus import ListPeersResult, PeerJoined as BusPeerJoined

from .core import APPROVAL_TOPIC, GATEWAY_CLIENT_ID, GatewayCore
from .core.frames import wire
from .events import (
    Action,
    CancelTimer,
    Commit,
    Event,
    MessageReceived,
    PeerJoined,
    PeerLeft,
    Record,
    Respond,
    Send,
    Sent,
    SetTimer,
    Spawn,
    TimerFired,
    TimerKey,
)
from .settings import GatewaySettings
from .state import ChannelKey, DecidedApprovals, GatewayState, Ledger, Orphans

__all__ = ["GATEWAY_CLIENT_ID", "Gateway"]

logger = logging.getLogger("peers.gateway")

_HANDLED = (
    "bcp_query_request",
    "bcp_response",
    "bcp_approval_decision",
    "bcp_screen_verdict",
    "bcp_forward",
    "peer_joined",
    "peer_left",
)


class Gateway:
    """Run the BCP flows over one :class:`~peers.client.Peer` connected as ``system:gateway``.

    Args:
        peer: an unconnected peer with the gateway's clientId and token.
        channels: the channels from the agent definitions, by ``(controller, reader)``.
        log: the activity log (the bus's own when running beside it).
        settings: expiry, retries, approval and outbox timeouts.
        clock: wall-clock seconds; tests may pass their own.
        log_content: what the rows keep of questions, answers and values delivered (``full``
            or ``digest``); the bus's own mode when running beside it.
    """

    def __init__(
        self,
        peer: Peer,
        channels: Mapping[ChannelKey, Channel],
        log: ActivityLog,
        *,
        settings: GatewaySettings | None = None,
        clock: Callable[[], float] = time.time,
        log_content: LogContent = "full",
    ) -> None:
        self.peer = peer
        self.channels = dict(channels)
        self.log = log
        self.settings = settings or GatewaySettings()
        self.core = GatewayCore(
            self.channels, GatewayState(), self.settings, clock=clock, log_content=log_content
        )
        """The decisions, sans I/O; this class carries out the actions they return."""
        self._timers: dict[TimerKey, asyncio.TimerHandle] = {}
        self._work: set[asyncio.Task[None]] = set()
        self._closed = False
        self._told = peer.on_connection
        peer.on_connection = self._on_connection
        for message_type in _HANDLED:
            peer.handle(message_type, self._on_message)
        peer.handle(None, self._ignore)

    @property
    def ledger(self) -> Ledger:
        """Bits and Cat-2 queries used per channel in the current session."""
        return self.core.state.ledger

    @property
    def decided(self) -> DecidedApprovals:
        """Approvals that ended, so a late decision is refused as ``already_decided``."""
        return self.core.state.decided

    def adopt(self, state: GatewayState) -> None:
        """Start from ``state`` (see :func:`peers.gateway.restore.load_state`).

        Call it inside the running event loop, before :meth:`start`: it arms the expiry of
        every held delivery.
        """
        for action in self.core.adopt(state):
            assert isinstance(action, SetTimer)
            self._set_timer(action)

    def use_channels(self, channels: Mapping[ChannelKey, Channel]) -> None:
        """Put reloaded channels in force now; readers whose active subscriptions changed are
        told again (``bcp_subscriptions_active``)."""
        self.channels = dict(channels)
        actions = self.core.use_channels(self.channels)
        if actions:
            self._spawn(self._carry_out(actions))

    def reset_budget(self, channel: ChannelKey) -> None:
        """Start a new budget session for ``channel``, as a restart after the reset row would."""
        self.core.reset_budget(channel)
        logger.info("budget reset for bcp:%s:%s", *channel)

    # Lifecycle

    async def start(self) -> None:
        """Connect, subscribe, tell every reader its active subscriptions, flush outboxes.

        Call :func:`peers.gateway.restore.restore` before this to carry budgets over a restart.
        """
        await self.peer.connect()
        patterns = ["bcp:*", "system:presence", APPROVAL_TOPIC]
        if any(channel.screeners for channel in self.channels.values()):
            # Screeners answer at this address; subscribing fails loudly if the policy says no.
            patterns.append(GATEWAY_CLIENT_ID)
        for pattern in patterns:
            await self.peer.subscribe(pattern)
        await self._learn_roles()
        await self._carry_out(self.core.start())
        logger.info("gateway started with %d channels", len(self.channels))

    def _on_connection(self, event: ConnectionEvent) -> None:
        if isinstance(event, Disconnected):
            # Peers may join, leave or change roles unseen: a role is unknown until heard again.
            self.core.forwards.presence.reset()
        elif isinstance(event, Reconnected) and not self._closed:
            task = asyncio.ensure_future(self._learn_roles())
            self._work.add(task)
            task.add_done_callback(self._work.discard)
        if self._told is not None:
            self._told(event)

    async def _learn_roles(self) -> None:
        """Learn the roles of peers that joined before presence was subscribed (at start, and
        after a reconnect), if the policy lets the gateway call ``listPeers``; if not, a peer's
        roles are known from its next ``peer_joined`` on, and a forward by role to it is
        refused until then."""
        try:
            listed = ListPeersResult.model_validate(await self.peer.request("listPeers"))
        except (RequestRefused, PeerTimeout, ValidationError) as exc:
            logger.info("roles of peers already connected not known (listPeers: %s)", exc)
            return
        self.core.forwards.presence.listed({p.client_id: p.roles for p in listed.peers})

    async def settle(self, orphans: Orphans) -> None:
        """Fail what was in flight when the gateway last stopped (see :mod:`.restore`).

        Each orphaned approval is logged as expired and each orphaned query ends in
        ``bcp_query_failed`` (``timeout``) to its controller, held if it is offline.
        """
        await self._carry_out(self.core.settle(orphans))

    async def close(self) -> None:
        """Stop timers, finish running work, flush the log and disconnect. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._work:
            await asyncio.wait(set(self._work), timeout=5)
        with contextlib.suppress(BusError):
            await self.log.commit()
        await self.peer.close()

    # Events in

    async def _on_message(self, message: Message) -> Reply:
        event: Event
        client_id = str(message.content.get("clientId", ""))
        if message.type == "peer_joined":
            event = PeerJoined(client_id, message.sender, _announced_roles(message.content))
        elif message.type == "peer_left":
            event = PeerLeft(client_id, message.sender)
        else:
            event = MessageReceived(
                message.message_id, message.sender, message.topic, message.type, message.content
            )
        reply = await self._carry_out(self.core.handle(event))
        if not reply.processed:
            logger.info(
                "refused %s from %s on %s: %s",
                message.type,
                message.sender,
                message.topic,
                reply.status,
            )
        return reply

    async def _ignore(self, message: Message) -> Reply:
        return Reply(True, "ignored")

    def _fire(self, key: TimerKey) -> None:
        self._timers.pop(key, None)
        if not self._closed:
            self._spawn(self._carry_out(self.core.handle(TimerFired(key))))

    # Actions out

    async def _carry_out(self, actions: Iterable[Action]) -> Reply:
        """Do what the core decided, in order; return the reply it chose.

        The actions that follow a send with a token run before those still queued.
        """
        queue = deque(actions)
        reply = Reply(True)
        while queue:
            match action := queue.popleft():
                case Record():
                    self.log.record(
                        action.event,
                        actor=action.actor,
                        topic=action.topic,
                        status=action.status,
                        payload=action.payload,
                        message_id=action.message_id,
                    )
                case Commit():
                    await self.log.commit()
                case Send():
                    delivered_to = await self._send(action)
                    if action.token is not None:
                        then = self.core.handle(Sent(action.token, delivered_to))
                        queue.extendleft(reversed(then))
                case Respond():
                    reply = Reply(action.ok, action.status, action.detail)
                case SetTimer():
                    self._set_timer(action)
                case CancelTimer():
                    timer = self._timers.pop(action.key, None)
                    if timer is not None:
                        timer.cancel()
                case Spawn():
                    self._spawn(self._carry_out(action.actions))
        return reply

    async def _send(self, action: Send) -> int:
        content = action.content
        wired = dict(content) if isinstance(content, Mapping) else wire(content)
        try:
            result = await self.peer.send(
                action.topic, action.type, wired, correlation_id=action.correlation_id
            )
        except (BusError, ConnectionError, TimeoutError) as exc:
            logger.warning("could not send %s to %s: %s", action.type, action.topic, exc)
            return 0
        return result.delivered_to

    def _set_timer(self, action: SetTimer) -> None:
        old = self._timers.pop(action.key, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[action.key] = loop.call_later(action.delay, self._fire, action.key)

    def _spawn(self, work: Awaitable[Reply]) -> None:
        if self._closed:
            if asyncio.iscoroutine(work):
                work.close()
            return
        task = asyncio.ensure_future(self._quietly(work))
        self._work.add(task)
        task.add_done_callback(self._work.discard)

    async def _quietly(self, work: Awaitable[Reply]) -> None:
        await work


def _announced_roles(content: Mapping[str, Any]) -> tuple[str, ...]:
    """The roles of a ``peer_joined``; none if it is malformed (a role entry then fails)."""
    try:
        return tuple(BusPeerJoined.model_validate(content).roles)
    except ValidationError:
        return ()
