"""Screens: a valid answer or push judged by the channel's screener peers before it goes on.

:meth:`Screens.ask` records a committed ``bcp_screen_requested`` row, sends one
``bcp_screen_request`` to each screener (in the background, each at its own address) and sets a
timer of ``screener_timeout`` seconds. Each screener's outcome is a ``bcp_screened`` row: its
verdict (``pass``, ``flag``, ``reject``), or ``unavailable`` (nobody took the request),
``malformed`` (what it sent is not a verdict about this answer) or ``timeout``. Once every
screener has one, or the timer fires, :func:`~peers.gateway.screeners.combine` turns them and
the gateway's own verdict into one, and the caller's continuation carries it through exactly as
it would have carried the unscreened verdict.

Only the screeners asked may answer a screen, once each; a verdict for a screen that is over is
refused (``unknown_screen``), which the bus logs in its ``process_finish`` row.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bus.core.logevents import LogEvent
from schemas.agents import Channel
from schemas.bcp import UNTRUSTED_NOTICE, BcpScreenRequest, QuerySpec

from ..events import Action, CancelTimer, Commit, MessageReceived, Respond, SetTimer, Spawn
from ..screeners import ScreenerOutcome, Unusable, combine, read_verdict, screen_texts
from ..validation import ValidationResult
from .context import Context
from .frames import iso

__all__ = ["Screen", "Screens"]

Judged = Callable[[ValidationResult], list[Action]]
"""What to do with an answer's verdict once its screeners have spoken."""


@dataclass
class Screen:
    """One answer waiting for its screeners."""

    screen_id: str
    channel: Channel
    ref: dict[str, str]
    """``query_id`` or ``subscription_id``, for every row."""
    fields: tuple[str, ...]
    result: ValidationResult
    """The gateway's own verdict, which the screeners' combine with."""
    then: Judged
    outcomes: dict[str, ScreenerOutcome] = field(default_factory=dict)

    @property
    def timer(self) -> tuple[str, str]:
        """The key of its timeout."""
        return ("screen", self.screen_id)


class Screens:
    """Ask screeners, take their verdicts, decide when all spoke or time ran out."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.pending: dict[str, Screen] = {}
        """Screens under way, by ``screen_id``."""

    @staticmethod
    def needed(channel: Channel, spec: QuerySpec, result: ValidationResult) -> bool:
        """Whether an answer goes to screeners: a valid Cat-2 or Cat-3 one on a channel with some.

        Cat-1 answers never do: each value is a boolean, an integer or an enum member that the
        controller's own spec lists, with nothing for a detector to read.
        """
        return bool(channel.screeners) and spec.category >= 2 and result.accepted

    def busy(self, channel: Channel, **ref: str) -> bool:
        """Whether an answer about ``ref`` (a ``subscription_id``) is being screened already."""
        return any(s.channel is channel and s.ref == ref for s in self.pending.values())

    def ask(
        self,
        channel: Channel,
        spec: QuerySpec,
        raw: Mapping[str, Any],
        result: ValidationResult,
        ref: dict[str, str],
        message_id: str,
        then: Judged,
    ) -> list[Action]:
        """Ask every screener of ``channel`` about the valid answer ``raw``; ``then`` decides.

        Returns the actions to carry out now; ``then`` runs later, with the combined verdict,
        once every screener answered or ``screener_timeout`` ran out. Its :class:`Respond`
        actions are dropped: the reply to the reader's message is the caller's to give now.
        """
        ctx, screen_id = self.ctx, f"sc-{uuid.uuid4().hex[:12]}"
        timeout = ctx.settings.screener_timeout
        request = self._request(screen_id, channel, spec, raw, result, ref)
        fields = tuple(text.field for text in request.texts)
        screen = Screen(screen_id, channel, ref, fields, result, then)
        self.pending[screen_id] = screen
        row = ctx.record(
            LogEvent.BCP_SCREEN_REQUESTED,
            channel,
            "pending",
            screen_id=screen_id,
            screeners=list(channel.screeners),
            fields=list(fields),
            message_id=message_id,
            **ref,
        )
        # Each request in the background: one slow screener does not hold up the others.
        sends = [
            Spawn((ctx.send_then(s, "bcp_screen_request", request, self._sent(screen, s)),))
            for s in channel.screeners
        ]
        return [row, Commit(), SetTimer(screen.timer, timeout), *sends]

    def _request(
        self,
        screen_id: str,
        channel: Channel,
        spec: QuerySpec,
        raw: Mapping[str, Any],
        result: ValidationResult,
        ref: dict[str, str],
    ) -> BcpScreenRequest:
        """The ``bcp_screen_request`` every screener of ``channel`` gets about ``raw``."""
        assert result.response is not None  # needed() asks about accepted answers only
        expires = self.ctx.clock() + self.ctx.settings.screener_timeout
        return BcpScreenRequest.model_validate(
            {
                "screen_id": screen_id,
                "channel": channel.topic,
                "controller": channel.controller,
                "reader": channel.reader,
                **ref,
                "category": spec.category,
                "texts": screen_texts(spec, raw, result.response),
                "taint": channel.reader_taint,
                "untrusted": True,
                "notice": UNTRUSTED_NOTICE,
                "expires_at": iso(expires),
            }
        )

    def receive(self, event: MessageReceived) -> list[Action]:
        """Take a screener's ``bcp_screen_verdict``; reply with whether it was taken."""
        screen_id = event.content.get("screen_id")
        screen = self.pending.get(screen_id) if isinstance(screen_id, str) else None
        if screen is None or event.sender not in screen.channel.screeners:
            detail = "no screen under way with this screen_id asked of this screener"
            return [Respond(False, "unknown_screen", detail)]
        if event.sender in screen.outcomes:
            detail = f"{event.sender} already gave its verdict on {screen.screen_id}"
            return [Respond(False, "already_screened", detail)]
        outcome = read_verdict(event.content, screen.fields)
        actions = self._settle(screen, event.sender, outcome, event.message_id)
        if isinstance(outcome, Unusable):
            return [*actions, Respond(False, "invalid_verdict", outcome.detail)]
        return [*actions, Respond(True, "screened")]

    def expire(self, screen_id: str) -> list[Action]:
        """Count every screener that has not answered as timed out, and decide."""
        screen = self.pending.get(screen_id)
        if screen is None:
            return []
        actions: list[Action] = []
        for screener in screen.channel.screeners:
            if screener not in screen.outcomes:
                detail = f"no verdict within {self.ctx.settings.screener_timeout:g} s"
                actions += self._settle(screen, screener, Unusable("timeout", detail))
        return actions

    def _sent(self, screen: Screen, screener: str) -> Callable[[int], list[Action]]:
        def sent(delivered_to: int) -> list[Action]:
            if delivered_to or self.pending.get(screen.screen_id) is not screen:
                return []
            if screener in screen.outcomes:
                return []  # It answered before the bus reported the delivery.
            detail = f"{screener} did not take the request (offline, or processed: false)"
            return self._settle(screen, screener, Unusable("unavailable", detail))

        return sent

    def _settle(
        self,
        screen: Screen,
        screener: str,
        outcome: ScreenerOutcome,
        message_id: str | None = None,
    ) -> list[Action]:
        """Record one screener's outcome; decide if it was the last one awaited."""
        screen.outcomes[screener] = outcome
        status: str = outcome.why if isinstance(outcome, Unusable) else outcome.verdict
        said: dict[str, Any] = {"detail": outcome.detail}
        if not isinstance(outcome, Unusable):
            said["findings"] = [f.model_dump(mode="json") for f in outcome.findings]
        row = self.ctx.record(
            LogEvent.BCP_SCREENED,
            screen.channel,
            status,
            screen_id=screen.screen_id,
            screener=screener,
            message_id=message_id,
            **said,
            **screen.ref,
        )
        if len(screen.outcomes) < len(screen.channel.screeners):
            return [row]
        return [row, *self._decide(screen)]

    def _decide(self, screen: Screen) -> list[Action]:
        del self.pending[screen.screen_id]
        channel = screen.channel
        outcomes = {s: screen.outcomes[s] for s in channel.screeners}
        final = combine(
            screen.result,
            outcomes,
            anomaly_action=channel.anomaly_action,
            screener_failure=channel.screener_failure,
        )
        carried = tuple(a for a in screen.then(final) if not isinstance(a, Respond))
        # In the background: the screener's reply does not wait for the delivery it allowed.
        return [CancelTimer(screen.timer), Spawn(carried)]
