"""Epochs and fetchMessages: every accepted message numbered, and read back by what a peer may
receive now. Real buses on port 0 with real SQLite logs, and the pure decisions of bus.log.fetch."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

import bus.log.history
from bus.core.epochs import Epochs
from bus.core.errors import AuditUnavailable, ContentNotKept, EpochNotKept, InvalidParams
from bus.core.identities import PeerIdentity
from bus.core.logevents import LogEvent
from bus.core.policy import Grants, Policy
from bus.log.activity import ActivityLog
from bus.log.fetch import FetchFilter, Page, check_since
from bus.log.history import StoredMessage
from bus.log.schema import SCHEMA
from bus.ops.config import Limits
from bus.server import BUS_CLIENT_ID, PRESENCE_TOPIC
from peers.testing import BusHarness, Inbox, running_bus, scaled

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas" / "json"

WATCHER = Policy.from_yaml(
    """
version: 1
roles:
  tg:
    members: ["tg:*"]
    send:
      - types: [tg_message]
        topics: ["agent:*", "ops:*"]
  watcher:
    members: ["ops:*"]
    subscribe: ["agent:*"]
"""
)
"""tg peers write to agents; ops peers may read every agent's topic."""

TAINTED = {
    "tg:9": PeerIdentity(frozenset(), "high"),
    "agent:w9": PeerIdentity(frozenset(), "high"),
}


def _valid(name: str, instance: Any) -> None:
    schema = json.loads((SCHEMAS / f"{name}.json").read_text(encoding="utf-8"))
    assert [e.message for e in Draft202012Validator(schema).iter_errors(instance)] == []


async def _send(h: BusHarness, sender: str, topic: str, count: int, **kwargs: Any) -> list[int]:
    """Send ``count`` messages from ``sender`` to ``topic``; return their epochs."""
    kind = "spawn_request" if topic == "system:spawn" else "tg_message"
    async with h.peer(sender) as peer:
        return [(await peer.send(topic, kind, {"n": n}, **kwargs)).epoch for n in range(count)]


# Epochs


def test_epochs_rise_strictly_whatever_the_clock_does():
    """Each epoch is above the last, and at least the clock when the clock is ahead."""
    now = iter([100, 100, 50, 500])
    epochs = Epochs(last=0, clock=lambda: next(now))
    assert [epochs.next() for _ in range(4)] == [100, 101, 102, 500]
    assert Epochs(last=7, clock=lambda: 3).next() == 8
    with pytest.raises(ValueError):
        Epochs(last=-1)


async def test_every_message_gets_a_rising_epoch_in_result_push_and_log(tmp_path):
    """sendMessage answers the epoch, processMessage carries it, every row of it stores it."""
    async with running_bus(tmp_path) as h:
        inbox = Inbox()
        async with h.peer("agent:w1") as agent:
            agent.handle(None, inbox)
            first_seen = agent.server_info.epoch
            epochs = await _send(h, "tg:42", "agent:w1", 3)
            assert first_seen < epochs[0] < epochs[1] < epochs[2]
            assert [(await inbox.get()).epoch for _ in range(3)] == epochs
        rows = h.rows(event="send_start", actor="tg:42")
        assert [row["epoch"] for row in rows] == epochs
        assert {row["status"] for row in rows} == {"taint:none"}
        finish = h.rows(event="process_finish", actor="agent:w1")
        assert [row["epoch"] for row in finish] == epochs


async def test_epochs_go_on_above_the_log_after_a_restart(tmp_path):
    """A bus restarted on the same log gives epochs above every one it gave before, presence
    events (the bus's own messages) included."""
    async with running_bus(tmp_path) as h:
        before = await _send(h, "tg:42", "agent:w1", 2)
    highest = max(row["epoch"] for row in h.rows(event="send_start"))
    presence = h.rows(event="send_start", actor=BUS_CLIENT_ID, topic=PRESENCE_TOPIC)
    assert presence and all(row["epoch"] for row in presence)
    assert highest >= before[-1]
    async with running_bus(tmp_path) as h2:
        assert h2.bus.latest_epoch == highest
        (after,) = await _send(h2, "tg:42", "agent:w1", 1)
        assert after > highest


async def test_a_log_from_before_epochs_gets_the_columns(tmp_path):
    """A log file created without the epoch and trace_id columns (nor their indexes) gets them
    when opened, and its old rows, which have no epoch, count for nothing."""
    db = tmp_path / "old.db"
    old = SCHEMA.replace(",\n    epoch INTEGER,\n    trace_id TEXT", "")
    old = "\n".join(
        line for line in old.split("\n") if "epoch" not in line and "WHERE event" not in line
    )
    assert "epoch" not in old and "chain TEXT" in old
    with sqlite3.connect(db) as conn:
        conn.executescript(old)
        conn.execute("INSERT INTO activity_log (ts, event) VALUES ('t', 'send_start')")
    async with ActivityLog(db) as log:
        assert log.last_epoch == 0
        await log.write(LogEvent.SEND_START, epoch=42, trace_id="ab" * 16)
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT epoch, typeof(epoch), trace_id FROM activity_log").fetchall()
        assert (None, "null", None) in rows and (42, "integer", "ab" * 16) in rows
        indexes = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
        assert {"idx_activity_epoch", "idx_activity_topic_epoch"} <= indexes
    async with ActivityLog(db) as log:
        assert log.last_epoch == 42


# fetchMessages on a real bus


async def test_fetch_pages_through_what_was_missed_oldest_first(tmp_path):
    """Messages sent while a peer was away come back in epoch order, a page at a time, with
    nextEpoch and more, and the answer satisfies its schema."""
    async with running_bus(tmp_path) as h:
        async with h.peer("agent:w1") as agent:
            since = agent.server_info.epoch
        epochs = await _send(h, "tg:42", "agent:w1", 5)
        async with h.peer("agent:w1") as agent:
            raw = await agent.request(
                "fetchMessages", {"topic": "agent:w1", "sinceEpoch": since, "limit": 3}
            )
            _valid("fetchMessages.result", raw)
            assert [m["epoch"] for m in raw["messages"]] == epochs[:3]
            assert raw["more"] is True and raw["nextEpoch"] == epochs[2]
            assert raw["messages"][0]["payload"]["content"] == {"n": 0}
            rest = await agent.fetch("agent:w1", raw["nextEpoch"], limit=3)
            assert [m.epoch for m in rest.messages] == epochs[3:]
            assert [m.content for m in rest.messages] == [{"n": 3}, {"n": 4}]
            assert rest.more is False and rest.next_epoch >= epochs[-1]
            assert (await agent.fetch("agent:w1", rest.next_epoch)).messages == []
        (row,) = [r for r in h.rows(event="fetch") if r["actor"] == "agent:w1"][:1]
        assert row["topic"] == "agent:w1" and row["status"] == "3 messages"


async def test_fetch_skips_the_peers_own_messages_and_other_topics(tmp_path):
    """A wildcard fetch returns the matching topics' messages sent by others, never its own."""
    policy_peer = "agent:system"  # may subscribe to system:spawn, system:route, agent:system
    async with running_bus(tmp_path) as h:
        spawn = await _send(h, "tg:42", "system:spawn", 1)
        async with h.peer(policy_peer) as system:
            await system.send("tg:42", "spawn_result", {})  # its own, on another topic
            page = await system.fetch("system:spawn", 0)
            assert [m.epoch for m in page.messages] == spawn
            assert (await system.fetch("agent:system", 0)).messages == []


async def test_fetch_refuses_a_pattern_the_policy_does_not_grant(tmp_path):
    """-32602 and a refused row for a pattern the peer may not subscribe to, bcp: included."""
    async with running_bus(tmp_path) as h:
        async with h.peer("agent:w1") as agent:
            for pattern in ("agent:w2", "bcp:*", "*"):
                with pytest.raises(InvalidParams, match="may not read"):
                    await agent.fetch(pattern, 0)
        refused = h.rows(event="refused", status="fetch_denied")
        assert [row["topic"] for row in refused] == ["agent:w2", "bcp:*", "*"]


async def test_fetch_keeps_the_taint_rule(tmp_path):
    """A tainted sender's message is withheld from an untainted reader, as its push was, and
    returned to a reader at least as tainted."""
    async with running_bus(tmp_path, identities=TAINTED) as h:
        async with h.peer("agent:w1") as w1, h.peer("agent:w9") as w9:
            clean = await _send(h, "tg:42", "agent:w1", 1)
            await _send(h, "tg:9", "agent:w1", 1)
            tainted = await _send(h, "tg:9", "agent:w9", 1)
            assert [m.epoch for m in (await w1.fetch("agent:w1", 0)).messages] == clean
            assert [m.epoch for m in (await w9.fetch("agent:w9", 0)).messages] == tainted
        (row,) = [r for r in h.rows(event="fetch") if r["actor"] == "agent:w1"]
        assert json.loads(row["payload_json"])["withheld"] == 1
        assert h.rows(event="taint_refused", actor="agent:w1")  # the push was refused too


async def test_fetch_refuses_epochs_the_log_does_not_cover(tmp_path):
    """An epoch older than the oldest kept, or later than the latest, is -32009 with what the
    log keeps; 0 and the oldest minus one read everything."""
    async with running_bus(tmp_path) as h:
        epochs = await _send(h, "tg:42", "agent:w1", 2)
        oldest = h.rows(event="send_start")[0]["epoch"]
        async with h.peer("agent:w1") as agent:
            # Presence events may take epochs meanwhile: "later" is a day ahead of the latest.
            for since in (oldest - 2, h.bus.latest_epoch + 86_400_000_000):
                before = h.bus.latest_epoch
                with pytest.raises(EpochNotKept) as caught:
                    await agent.fetch("agent:w1", since)
                data = caught.value.data
                assert data["oldestEpoch"] == oldest
                assert before <= data["latestEpoch"] <= h.bus.latest_epoch
            for since in (0, oldest - 1):
                assert [m.epoch for m in (await agent.fetch("agent:w1", since)).messages] == epochs


async def test_fetch_says_so_when_the_log_keeps_only_digests(tmp_path):
    """With log_content digest there is no content to give back: -32010, not an empty page."""
    async with running_bus(tmp_path, log_content="digest") as h:
        await _send(h, "tg:42", "agent:w1", 1)
        async with h.peer("agent:w1") as agent:
            with pytest.raises(ContentNotKept, match="digest"):
                await agent.fetch("agent:w1", 0)


async def test_a_message_refused_for_the_log_is_never_fetched(tmp_path, monkeypatch):
    """A message answered -32006 (the log could not commit) is not fetched when its rows land
    later; the retry that went through is, once."""
    async with running_bus(tmp_path) as h:
        async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg:
            real_commit = h.log.commit

            async def failing_commit() -> None:
                raise AuditUnavailable("disk full")

            monkeypatch.setattr(h.log, "commit", failing_commit)
            with pytest.raises(AuditUnavailable):
                await tg.send("agent:w1", "tg_message", {"n": 1}, message_id="once")
            monkeypatch.setattr(h.log, "commit", real_commit)
            sent = await tg.send("agent:w1", "tg_message", {"n": 1}, message_id="once")
            page = await agent.fetch("agent:w1", 0)
            assert [m.epoch for m in page.messages] == [sent.epoch]
        (aborted,) = h.rows(event="send_aborted")
        assert aborted["message_id"] == "once" and aborted["epoch"] < sent.epoch


async def test_fetch_limit_is_capped_and_a_long_scan_stops_with_more(tmp_path, monkeypatch):
    """limit is cut to max_fetch_messages; a fetch that reads its row budget without filling the
    page answers more: true and a nextEpoch to go on from, and going on finds the rest."""
    monkeypatch.setattr(bus.log.history, "SCAN_ROWS", 4)
    monkeypatch.setattr(bus.log.history, "CHUNK_ROWS", 2)
    limits = Limits(max_fetch_messages=2)
    async with running_bus(tmp_path, policy=WATCHER, limits=limits) as h:
        start = await _send(h, "tg:42", "agent:w1", 1)
        await _send(h, "tg:42", "ops:elsewhere", 8)
        wanted = await _send(h, "tg:42", "agent:w2", 3)
        async with h.peer("ops:watch") as watcher:
            page = await watcher.fetch("agent:*", start[0], limit=50)
            assert page.messages == [] and page.more
            since, seen = page.next_epoch, []
            while page.more:
                page = await watcher.fetch("agent:*", since, limit=50)
                assert len(page.messages) <= 2
                seen += [m.epoch for m in page.messages]
                since = page.next_epoch
            assert seen == wanted


async def test_fetch_reads_a_message_whose_rows_were_not_yet_committed(tmp_path, monkeypatch):
    """A message given its epoch before the fetch began, its rows still waiting for the disk,
    is in the page: the fetch waits for them instead of reading around them."""
    async with running_bus(tmp_path) as h:
        since = h.bus.latest_epoch
        release = threading.Event()
        real_insert, real_commit = h.log._store.insert, h.log.commit
        commits: asyncio.Queue[None] = asyncio.Queue()

        def held_insert(batch: Any) -> None:
            release.wait(scaled(10))
            real_insert(batch)

        async def counted_commit() -> None:
            commits.put_nowait(None)
            await real_commit()

        monkeypatch.setattr(h.log._store, "insert", held_insert)
        monkeypatch.setattr(h.log, "commit", counted_commit)
        envelope = {"messageId": "m1", "type": "tg_message", "from": "tg:42", "content": {}}
        publishing = asyncio.ensure_future(
            h.bus.publish("agent:w1", envelope, "m1", "tg_message", sender=None)
        )
        await commits.get()  # its rows are recorded, held on their way to the disk
        fetching = asyncio.ensure_future(
            h.bus.fetch(Grants("agent:w1", subscribe_patterns=("agent:w1",)), "agent:w1", since)
        )
        async with asyncio.timeout(scaled(5)):
            await asyncio.wait(
                [fetching, asyncio.ensure_future(commits.get())], return_when="FIRST_COMPLETED"
            )
        release.set()
        await publishing
        page = await fetching
        assert [m.payload["messageId"] for m in page.messages] == ["m1"]


# The pure decisions


def _row(epoch: int, topic: str = "agent:w1", sender: str = "tg:42", **kwargs: Any) -> Any:
    envelope = {"messageId": f"m{epoch}", "type": "tg_message", "from": sender, "content": {}}
    fields = {
        "ts": f"2026-01-01T00:00:{epoch:02d}.000000Z",
        "mark": "taint:none",
        "payload_json": json.dumps({**envelope, **kwargs.pop("envelope", {})}),
        **kwargs,
    }
    return StoredMessage(epoch=epoch, topic=topic, sender=sender, **fields)


def test_page_reads_bcp_topics_only_for_the_declassifier():
    """A bcp: message matching the pattern is read by the declassifier, by no one else."""
    other = Grants("agent:w1", subscribe_patterns=("*",))
    gateway = Grants("system:gateway", declassifier=True, subscribe_patterns=("*",))
    for grants, expected in ((other, []), (gateway, [1])):
        page = Page(grants, "*", since=0, limit=10)
        page.add(_row(1, topic="bcp:main:researcher", sender="agent:researcher"))
        assert [m.epoch for m in page.messages] == expected


def test_page_refuses_a_sender_mark_it_does_not_know():
    """A row whose sender taint is missing or unknown is withheld (fail closed)."""
    page = Page(Grants("agent:w1"), "agent:w1", since=0, limit=10)
    page.add(_row(1, mark=None))
    page.add(_row(2, mark="taint:extreme"))
    page.add(_row(3, mark="declassifier"))
    assert [m.epoch for m in page.messages] == [3] and page.withheld == 2


def test_page_filters_on_type_correlation_sender_and_time():
    """FetchFilter narrows on the envelope's type and correlationId, the sender and the time."""
    rows = [
        _row(1, envelope={"correlationId": "c1"}),
        _row(2, sender="tg:7"),
        _row(3, envelope={"type": "other"}),
        _row(4, envelope={"correlationId": "c1"}),
    ]
    cases = [
        (FetchFilter(correlation_id="c1"), [1, 4]),
        (FetchFilter(sender="tg:7"), [2]),
        (FetchFilter(type="other"), [3]),
        (FetchFilter(after=rows[1].ts, before=rows[3].ts), [2, 3]),
    ]
    for only, expected in cases:
        page = Page(Grants("agent:w1"), "agent:w1", since=0, limit=10, only=only)
        for row in rows:
            page.add(row)
        assert [m.epoch for m in page.messages] == expected


def test_check_since_bounds():
    """0 always passes; otherwise from the oldest minus one up to the latest."""
    check_since(0, 100, 200)
    check_since(99, 100, 200)
    check_since(200, 100, 200)
    check_since(5, None, 200)
    for since in (98, 201):
        with pytest.raises(EpochNotKept):
            check_since(since, 100, 200)


async def test_a_log_that_cannot_be_read_is_32006_not_an_internal_error(tmp_path, monkeypatch):
    """A read the database fails is answered -32006 (retry later), with its rpc_error row."""
    async with running_bus(tmp_path) as h, h.peer("agent:w1") as agent:

        async def broken(*args: Any, **kwargs: Any) -> bool:
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(h.bus._history, "fill", broken)
        with pytest.raises(AuditUnavailable, match="could not be read"):
            await agent.fetch("agent:w1", 0)
        assert h.rows(event="rpc_error", status="-32006")
