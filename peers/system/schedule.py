"""When agent definitions' ``cron_schedules`` fire, and the clock that says when it is.

:func:`next_due` is pure: given the definitions and a time, it says which schedules fire next
and when. :class:`Scheduler` is the loop that waits for that time on a :class:`Clock` and hands
each due schedule to a callback; :class:`~peers.system.system.SystemPeer` runs one and sends the
agent its ``scheduled_message``. Tests give it a clock they move by hand, so no test waits for
a real minute.

Times are UTC, as cron expressions in definitions are read (:class:`schemas.agents.CronSchedule`).
A time missed while nothing ran (the system peer stopped) is not made up for, as cron does not;
one missed while the loop was busy, by less than :data:`CATCH_UP`, still fires.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from croniter import croniter

from schemas.agents import AgentDefinition, CronSchedule

__all__ = ["CATCH_UP", "RELOAD_EVERY", "Clock", "Due", "Scheduler", "SystemClock", "next_due"]

logger = logging.getLogger("peers.system")

CATCH_UP = timedelta(minutes=1)
"""How late a scheduled time may be noticed and still fire."""

RELOAD_EVERY = timedelta(minutes=1)
"""The longest the loop sleeps before it reads the definitions again: an edited schedule takes
effect within this."""


@dataclass(frozen=True, slots=True)
class Due:
    """One schedule of one agent, due at ``at``."""

    agent: str
    schedule: CronSchedule
    at: datetime


def next_due(
    definitions: Mapping[str, AgentDefinition], after: datetime
) -> tuple[datetime, list[Due]] | None:
    """The first time strictly after ``after`` at which a schedule fires, and every schedule
    that fires then (in definition order); None when no definition has a schedule.

    ``after`` must be timezone-aware; the times returned are UTC.
    """
    after = after.astimezone(UTC)
    first: datetime | None = None
    due: list[Due] = []
    for name, definition in definitions.items():
        for schedule in definition.cron_schedules:
            at = croniter(schedule.schedule, after).get_next(datetime)
            if first is None or at < first:
                first, due = at, []
            if at == first:
                due.append(Due(name, schedule, at))
    return None if first is None else (first, due)


class Clock(Protocol):
    """What the scheduler reads the time from and waits on."""

    def now(self) -> datetime:
        """The current time, timezone-aware."""
        ...

    async def sleep_until(self, when: datetime) -> None:
        """Return at ``when`` (at once if it has passed)."""
        ...


class SystemClock:
    """The machine's clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep_until(self, when: datetime) -> None:
        # The loop's clock is monotonic, the wall clock (the one cron speaks) may jump; the
        # scheduler never sleeps longer than RELOAD_EVERY, which bounds the drift.
        await asyncio.sleep(max(0.0, (when - self.now()).total_seconds()))


class Scheduler:
    """Waits for each schedule's time and calls ``fire`` with it, until closed.

    Args:
        definitions: reads the agent definitions; called before each wait, so an edit takes
            effect within :data:`RELOAD_EVERY`. It may raise: the error is logged and the last
            good definitions are used.
        fire: called with each :class:`Due` at its time; it must not block (start a task).
        clock: the time; :class:`SystemClock` by default.
    """

    def __init__(
        self,
        definitions: Callable[[], Mapping[str, AgentDefinition]],
        fire: Callable[[Due], None],
        *,
        clock: Clock | None = None,
    ) -> None:
        self.definitions = definitions
        self.fire = fire
        self.clock = clock or SystemClock()
        self._known: Mapping[str, AgentDefinition] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the loop, from now on: times before now do not fire."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(self.clock.now()))

    async def close(self) -> None:
        """Stop the loop. Idempotent."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self, after: datetime) -> None:
        while True:
            found = next_due(self._read(), after)
            wake = self.clock.now() + RELOAD_EVERY
            if found is not None and found[0] <= wake:
                wake = found[0]
            await self.clock.sleep_until(wake)
            now = self.clock.now()
            if found is None or now < found[0]:
                continue  # woke to read the definitions again
            at, due = found
            if at < now - CATCH_UP:  # the clock jumped, or the machine slept: too late
                logger.warning("cron_schedules: skipped the times from %s to %s", at, now)
                after = now - CATCH_UP
                continue
            for item in due:
                self.fire(item)
            after = at

    def _read(self) -> Mapping[str, AgentDefinition]:
        try:
            self._known = self.definitions()
        except (OSError, ValueError) as exc:  # a definition mid-edit: keep the last good ones
            logger.error("cron_schedules: the agent definitions do not load: %s", exc)
        return self._known
