"""The chat end of the bootstrap flow: spawn, route, configure, then talk, retrying until answered.

:class:`Chat` runs on a :class:`~peers.client.Peer` (the chat's clientId, ``tg:<name>``) and a
:class:`~peers.chat.store.ChatStore`. One loop does what is due, in this order:

1. no route: send ``spawn_request {agent}`` to ``system:spawn`` and wait for ``route_assigned``
   (asked again after ``reply_timeout``, or sooner with backoff when the system peer did not take
   the request);
2. a route but no ``configure`` taken: send ``configure {talkto: <this chat>}`` to the agent, with
   backoff; after ``respawn_after`` failures in a row, ask the system peer for the agent again
   (it restarts an agent that exited, and keeps the route);
3. then the lines, oldest first: ``tg_message {id, text}``; a line the agent did not take is
   tried again with backoff (and ``configure`` sent again first: a restarted agent has forgotten
   it); a line taken but not answered within ``reply_timeout`` is sent again. Each attempt has
   the envelope ``messageId`` ``<id>.<attempt>``; the ``id`` stays, so the agent recognizes a
   retry. A ``tg_reply`` whose ``in_reply_to`` names a line ends its retries.

A ``tg_reply`` from ``system:gateway`` is a reader's sealed text a controller forwarded
(docs/bcp.md, "Sealed values"): taken only marked ``untrusted``, reported with its ``notice`` and
``provenance``, and it answers a line only when its channel's controller is the chat's agent.

Every decision is committed to the store before it is acted on, so a chat killed at any point and
started again with the same file goes on where it was, without a second spawn.

A ``spawn_result`` that says the agent cannot be started (no such definition, no command, no
token, a program that does not run) ends :meth:`Chat.run` with :class:`SpawnFailed`: asking
again would get the same answer until the operator fixes it. The lines stay queued in the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from schemas.bcp import UNTRUSTED_NOTICE
from schemas.chat import (
    SPAWN_TOPIC,
    SYSTEM_CLIENT_ID,
    Configure,
    RouteAssigned,
    SpawnRequest,
    SpawnResult,
    TgMessage,
    TgReply,
)
from schemas.common import GATEWAY_CLIENT_ID

from ..client import Message, Peer, Reply
from ..errors import DuplicateMessage, PeerError
from .store import ChatStore, Route

__all__ = ["Chat", "Out", "RetrySettings", "SpawnFailed"]

Out = Callable[[dict[str, Any]], None]
"""Receives each event of the chat as a dict with an ``event`` key."""


@dataclass(frozen=True, slots=True)
class RetrySettings:
    """When the chat sends again.

    Args:
        initial: seconds before the first retry of something the other end did not take;
            each further retry waits twice as long.
        maximum: the longest wait between two retries.
        reply_timeout: seconds to wait for a reply (``route_assigned`` to a spawn request,
            ``tg_reply`` to a line the agent took) before sending again.
        respawn_after: failed ``configure`` attempts in a row before asking the system peer
            for the agent again.
    """

    initial: float = 1.0
    maximum: float = 60.0
    reply_timeout: float = 30.0
    respawn_after: int = 3

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` failed attempts in a row (1 or more)."""
        return float(min(self.maximum, self.initial * 2 ** max(0, failures - 1)))


class SpawnFailed(Exception):
    """The system peer answered that the chat's agent cannot be started.

    Attributes:
        result: its ``spawn_result``: ``error`` says which failure, ``detail`` in words.
    """

    def __init__(self, result: SpawnResult) -> None:
        super().__init__(result)
        self.result = result

    def __str__(self) -> str:
        error = self.result.error.value if self.result.error is not None else "failed"
        detail = f": {self.result.detail}" if self.result.detail else ""
        return f"{SYSTEM_CLIENT_ID} cannot start agent:{self.result.agent} ({error}){detail}"


class Chat:
    """One chat's side of the flow; call :meth:`say` for each line and :meth:`run` to send.

    Args:
        peer: the chat's connection; its handlers are registered here, connect it after.
        store: the chat's file, opened for ``peer.client_id``.
        agent: the agent definition to ask the system peer for.
        out: receives every event.
        settings: when to send again.
    """

    def __init__(
        self,
        peer: Peer,
        store: ChatStore,
        agent: str,
        *,
        out: Out,
        settings: RetrySettings | None = None,
    ) -> None:
        self.peer = peer
        self.store = store
        self.agent = agent
        self.out = out
        self.settings = settings or RetrySettings()
        self._wake = asyncio.Event()
        self._input_ended = False
        self._spawn_attempts = 0
        self._spawn_due = 0.0
        self._configure_failures = 0
        self._configure_due = 0.0
        self._spawn_failed: SpawnResult | None = None
        peer.handle("spawn_result", self._on_spawn_result)
        peer.handle("route_assigned", self._on_route_assigned)
        peer.handle("tg_reply", self._on_reply)

    # Input

    def say(self, text: str) -> None:
        """Queue a line; it is on disk (and ``queued`` reported) when this returns."""
        item = self.store.queue(text)
        self.out({"event": "queued", "id": item.id, "text": text})
        self._wake.set()

    def end_of_input(self) -> None:
        """No more lines: :meth:`run` returns once every line is answered."""
        self._input_ended = True
        self._wake.set()

    # The loop

    async def run(self) -> None:
        """Send what is due until input has ended and every line is answered.

        Raises:
            SpawnFailed: the system peer cannot start the agent; run the chat again once the
                operator has fixed what ``result.detail`` names.
        """
        route = self.store.route()
        if route is not None:
            self.out(
                {"event": "resumed", "agent": route.agent, "unanswered": self.store.unanswered()}
            )
        while not (self._input_ended and self.store.unanswered() == 0):
            if self._spawn_failed is not None:
                raise SpawnFailed(self._spawn_failed)
            self._wake.clear()
            delay = await self._step(time.time())
            if delay is None or delay > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()

    async def _step(self, now: float) -> float | None:
        """Do what is due; return the seconds until more is (None: until an event)."""
        route = self.store.route()
        if route is None:
            return await self._spawn(now)
        if not route.configured:
            return await self._configure(route, now)
        return await self._send_next(route, now)

    async def _spawn(self, now: float, *, again: bool = False) -> float:
        if now < self._spawn_due and not again:
            return self._spawn_due - now
        self._spawn_attempts += 1
        self.out({"event": "spawn_requested", "agent": self.agent, "attempt": self._spawn_attempts})
        taken = await self._send(SPAWN_TOPIC, "spawn_request", SpawnRequest(agent=self.agent))
        wait = self.settings.reply_timeout if taken else self.settings.delay(self._spawn_attempts)
        if not taken and self._spawn_attempts == 1:
            # Said once: without it a chat with no system peer to answer waits in silence.
            self.out({"event": "spawn_not_taken", "waiting_for": SYSTEM_CLIENT_ID})
        self._spawn_due = now + wait
        return wait

    async def _configure(self, route: Route, now: float) -> float:
        if now < self._configure_due:
            return self._configure_due - now
        if await self._send(route.agent, "configure", Configure(talkto=self.peer.client_id)):
            self.store.set_configured(True)
            self._configure_failures = 0
            self.out({"event": "configured", "agent": route.agent})
            return 0
        self._configure_failures += 1
        wait = self.settings.delay(self._configure_failures)
        self._configure_due = now + wait
        self.out({"event": "not_configured", "agent": route.agent, "retry_in": wait})
        if self._configure_failures % self.settings.respawn_after == 0:
            await self._spawn(now, again=True)
        return wait

    async def _send_next(self, route: Route, now: float) -> float | None:
        item = self.store.next_to_send(now)
        due = self.store.next_due_at()
        if item is None or item.next_at > now:
            return None if due is None else max(0.0, due - now)
        attempt = self.store.start_attempt(item.id)
        self.out({"event": "sending", "id": item.id, "attempt": attempt})
        message = TgMessage(text=item.text, id=item.id)
        event = {"id": item.id, "attempt": attempt}
        if await self._send(route.agent, "tg_message", message, message_id=f"{item.id}.{attempt}"):
            self.store.delivered(item.id, time.time() + self.settings.reply_timeout)
            self.out({"event": "delivered", **event})
        else:
            wait = self.settings.delay(attempt)
            self.store.not_delivered(item.id, time.time() + wait)
            # The agent may have restarted and forgotten this chat: configure it again first.
            self.store.set_configured(False)
            self.out({"event": "not_delivered", **event, "retry_in": wait})
        return 0

    async def _send(
        self, topic: str, message_type: str, content: BaseModel, *, message_id: str | None = None
    ) -> bool:
        """Send; return whether a peer took it (``deliveredTo`` at least 1)."""
        body = content.model_dump(exclude_none=True)
        message_id = message_id or uuid.uuid4().hex
        self.store.record("out", message_type, body, message_id=message_id, peer=topic)
        try:
            result = await self.peer.send(topic, message_type, body, message_id=message_id)
        except DuplicateMessage:
            return True  # -32008: the bus accepted this very message before
        except PeerError as exc:
            self.out({"event": "send_failed", "type": message_type, "error": str(exc)})
            return False
        return result.delivered_to >= 1

    # What arrives

    def _accept(self, message: Message, model: type[BaseModel]) -> Any:
        content = model.model_validate(message.content)
        self.store.record(
            "in", message.type, message.content, message_id=message.message_id, peer=message.sender
        )
        return content

    async def _on_spawn_result(self, message: Message) -> Reply:
        if message.sender != SYSTEM_CLIENT_ID:
            return Reply(False, "refused", f"only {SYSTEM_CLIENT_ID} answers spawn requests")
        try:
            result: SpawnResult = self._accept(message, SpawnResult)
        except ValidationError:
            return Reply(False, "invalid", "malformed spawn_result")
        self.out({"event": "spawn_result", **result.model_dump(mode="json", exclude_none=True)})
        if not result.success and result.agent == self.agent:
            self._spawn_failed = result
            self._wake.set()
        return Reply(True)

    async def _on_route_assigned(self, message: Message) -> Reply:
        if message.sender != SYSTEM_CLIENT_ID:
            return Reply(False, "refused", f"only {SYSTEM_CLIENT_ID} assigns routes")
        try:
            route: RouteAssigned = self._accept(message, RouteAssigned)
        except ValidationError:
            return Reply(False, "invalid", "malformed route_assigned")
        if route.chat != self.peer.client_id or not route.agent.startswith("agent:"):
            return Reply(False, "refused", "not a route for this chat to an agent")
        if self.store.assign(route.agent):
            self._configure_failures = 0
            self._configure_due = 0.0
            self.out({"event": "route_assigned", "agent": route.agent})
        self._wake.set()
        return Reply(True)

    async def _on_reply(self, message: Message) -> Reply:
        route = self.store.route()
        forwarded = message.sender == GATEWAY_CLIENT_ID
        if not forwarded and (route is None or message.sender != route.agent):
            return Reply(False, "refused", "not from this chat's agent")
        try:
            reply = TgReply.model_validate(message.content)
        except ValidationError:
            return Reply(False, "invalid", "malformed tg_reply")
        if forwarded and reply.untrusted is not True:
            # The gateway marks every forward; one unmarked is not one to show as a reply.
            return Reply(False, "refused", "a forward from the gateway comes marked untrusted")
        self._accept(message, TgReply)
        event: dict[str, Any] = {
            "from": message.sender,
            "id": reply.in_reply_to,
            "text": reply.text,
        }
        if reply.untrusted:
            # A reader's text the gateway forwarded: shown as data, never as the agent's words.
            event |= {"untrusted": True, "notice": reply.notice or UNTRUSTED_NOTICE}
            event["provenance"] = reply.provenance or {}
        first = True
        if reply.in_reply_to is not None and (not forwarded or _from_route(reply, route)):
            first = self.store.answered(reply.in_reply_to)
        self.out({"event": "reply" if first else "duplicate_reply", **event})
        self._wake.set()
        return Reply(True)


def _from_route(reply: TgReply, route: Route | None) -> bool:
    """Whether a forward was sent on by this chat's agent (the controller of the channel its
    text came from): only then may it answer one of the chat's lines."""
    channel = (reply.provenance or {}).get("channel", "")
    _bcp, _, rest = channel.partition(":")
    controller = rest.partition(":")[0]
    return route is not None and bool(controller) and route.agent == f"agent:{controller}"
