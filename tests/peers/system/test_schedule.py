"""Agent definitions' cron_schedules, model, tools and network: when schedules fire (pure), the
scheduler on a clock moved by hand, and the system peer on a real bus sending a real agent its
scheduled message."""

from __future__ import annotations

import asyncio
import json
import textwrap
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from peers.system import EphemeralTokens, SystemPeer
from peers.system.schedule import CATCH_UP, Due, Scheduler, next_due
from peers.testing import Events, running_bus, scaled
from schemas.agents import DefinitionError, load_agents, parse_agent
from schemas.chat import ScheduledMessage

T0 = datetime(2026, 3, 2, 12, 3, tzinfo=UTC)  # a Monday


class ManualClock:
    """A clock a test moves; sleepers wake when it passes their time, and the test can wait
    until the code under test sleeps until a given time."""

    def __init__(self, now: datetime) -> None:
        self._now = now
        self._changed = asyncio.Condition()
        self.sleeps: list[datetime] = []

    def now(self) -> datetime:
        return self._now

    async def sleep_until(self, when: datetime) -> None:
        async with self._changed:
            self.sleeps.append(when)
            self._changed.notify_all()
            await self._changed.wait_for(lambda: self._now >= when)

    async def move_to(self, when: datetime) -> None:
        async with self._changed:
            self._now = when
            self._changed.notify_all()

    async def asleep_until(self, when: datetime) -> None:
        """Return once something sleeps until ``when`` (or has since the last move)."""
        async with asyncio.timeout(scaled(5)), self._changed:
            await self._changed.wait_for(lambda: when in self.sleeps)


def write_agents(directory: Path, **frontmatter: str) -> Path:
    directory.mkdir(exist_ok=True)
    for name, extra in frontmatter.items():
        text = f"---\nname: {name}\n{textwrap.dedent(extra).strip()}\n---\nProse.\n"
        (directory / f"{name}.md").write_text(text)
    return directory


SCHEDULES = """
cron_schedules:
  - {schedule: "*/5 * * * *", message: "Look again.", label: five}
  - {schedule: "@hourly", message: "Summarize the hour."}
"""


def test_next_due_is_the_earliest_time_after_and_every_schedule_at_it(tmp_path):
    """The first time strictly after the given one, UTC, with each schedule firing then."""
    agents = load_agents(
        write_agents(
            tmp_path / "a",
            main=SCHEDULES,
            other='cron_schedules: [{schedule: "0 * * * *", message: "Hi."}]',
        )
    )
    at, due = next_due(agents, T0)
    assert at == datetime(2026, 3, 2, 12, 5, tzinfo=UTC)
    assert [(d.agent, d.schedule.label) for d in due] == [("main", "five")]
    at, due = next_due(agents, datetime(2026, 3, 2, 12, 55, tzinfo=UTC))  # strictly after
    assert at == datetime(2026, 3, 2, 13, 0, tzinfo=UTC)
    assert sorted(d.agent for d in due) == ["main", "main", "other"]
    local = datetime(2026, 3, 2, 14, 3, tzinfo=timezone(timedelta(hours=2)))  # 12:03 UTC
    assert next_due(agents, local)[0] == datetime(2026, 3, 2, 12, 5, tzinfo=UTC)
    assert next_due(load_agents(write_agents(tmp_path / "b", quiet="")), T0) is None


@pytest.mark.parametrize(
    "schedule", ["61 * * * *", "* * * *", "0 0 * * * 2027", "every hour", "@sometimes"]
)
def test_a_schedule_cron_cannot_read_is_a_definition_error(schedule):
    """A bad cron expression, or one with other than five fields, names the field and says
    what a schedule looks like."""
    text = f'---\nname: main\ncron_schedules: [{{schedule: "{schedule}", message: "x"}}]\n---\n'
    with pytest.raises(DefinitionError) as caught:
        parse_agent(text, source="main.md")
    assert caught.value.field == "cron_schedules[0].schedule"
    assert "five fields" in str(caught.value) and "UTC" in str(caught.value)


def at(hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(2026, 3, 2, hour, minute, second, tzinfo=UTC)


async def test_the_scheduler_fires_each_time_once_and_rereads_the_definitions(tmp_path):
    """Nothing fires before its time; at it, each due schedule once; an added schedule is
    picked up within a minute; times missed by more than CATCH_UP do not fire."""
    agents = write_agents(tmp_path / "agents", main=SCHEDULES)
    clock = ManualClock(T0)
    fired: list[Due] = []
    scheduler = Scheduler(lambda: load_agents(agents), fired.append, clock=clock)
    scheduler.start()
    try:
        await clock.asleep_until(at(12, 4))  # a minute at most: then it reads them again
        await clock.move_to(at(12, 4, 59))
        await clock.asleep_until(at(12, 5))
        assert fired == []
        await clock.move_to(at(12, 5))
        await clock.asleep_until(at(12, 6))
        assert [(d.agent, d.at, d.schedule.message) for d in fired] == [
            ("main", at(12, 5), "Look again.")
        ]
        write_agents(agents, late='cron_schedules: [{schedule: "7 12 * * *", message: "Late."}]')
        await clock.move_to(at(12, 7))
        await clock.asleep_until(at(12, 8))
        assert [(d.agent, d.at) for d in fired[1:]] == [("late", at(12, 7))]
        # The clock jumps to 14:00:30: 12:10 to 13:55 are skipped, 14:00 fires (within
        # CATCH_UP), both of main's schedules.
        await clock.move_to(at(14, 0, 30))
        await clock.asleep_until(at(14, 1, 30))
        assert [(d.at, d.schedule.message) for d in fired[2:]] == [
            (at(14, 0), "Look again."),
            (at(14, 0), "Summarize the hour."),
        ]
        assert CATCH_UP >= timedelta(seconds=30)
    finally:
        await scheduler.close()


async def test_a_scheduled_message_starts_the_agent_and_reaches_it(tmp_path):
    """At a schedule's time the system peer starts the agent (a real echo process) and sends it
    a scheduled_message it takes, logged on the bus; model, tools and network reach the
    command as BCPBUS_AGENT_* variables."""
    show_env = (
        "import json, os; print(json.dumps({k: os.environ.get('BCPBUS_AGENT_' + k) "
        "for k in ('MODEL', 'TOOLS', 'NETWORK')}))"
    )
    agents = write_agents(
        tmp_path / "agents",
        echo="""
            command: [python, -m, peers.examples.echo]
            cron_schedules:
              - {schedule: "*/5 * * * *", message: "Look again.", label: five}
            """,
        envy=f"""
            model: claude-test
            tools: Read, WebFetch
            network: outbound
            command: [python, -c, "{show_env}"]
            """,
    )
    clock = ManualClock(T0)
    events = Events()
    async with running_bus(tmp_path) as h:
        peer = h.peer("agent:system")
        system = SystemPeer(
            peer,
            agents,
            EphemeralTokens(h.credentials),
            out=events,
            clock=clock,
            stop_timeout=scaled(5),
        )
        await system.start()
        try:
            await clock.asleep_until(at(12, 4))
            await clock.move_to(at(12, 5))
            sent = await events.wait_for("scheduled", seconds=30, agent="echo")
            assert sent["at"] == "2026-03-02T12:05:00+00:00"
            assert events.of("started")[0]["agent"] == "echo"
            line = await events.wait_for("output", seconds=30, agent="echo")
            while '"scheduled"' not in line["line"]:
                line = await next_output(events, "echo", after=line)
            assert json.loads(line["line"]) == {
                "event": "scheduled",
                "message": "Look again.",
                "at": "2026-03-02T12:05:00+00:00",
            }
            rows = [
                json.loads(row["payload_json"])
                for row in h.rows(event="send_start", topic="agent:echo", actor="agent:system")
            ]
            assert [row["type"] for row in rows][-1] == "scheduled_message"
            ScheduledMessage.model_validate(rows[-1]["content"])

            async with h.peer("tg:1") as chat:
                await chat.send("system:spawn", "spawn_request", {"agent": "envy"})
                printed = await events.wait_for("output", seconds=30, agent="envy")
            assert json.loads(printed["line"]) == {
                "MODEL": "claude-test",
                "TOOLS": "Read,WebFetch",
                "NETWORK": "outbound",
            }
        finally:
            await system.close()


async def next_output(events: Events, agent: str, *, after: dict) -> dict:
    """The output event of ``agent`` that follows ``after``, waiting for it."""
    async with asyncio.timeout(scaled(30)):
        while True:
            outputs = [e for e in events.of("output") if e["agent"] == agent]
            index = next(i for i, e in enumerate(outputs) if e is after)
            if index + 1 < len(outputs):
                return outputs[index + 1]
            events._arrived.clear()
            await events._arrived.wait()
