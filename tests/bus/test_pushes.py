"""minRelevance and debounceMs: the pure decisions of bus.core.pushes, then on a real bus."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, strategies as st
from jsonschema import Draft202012Validator

from bus.core.errors import InvalidParams
from bus.core.pushes import PLAIN, Debounce, PushOptions, push_window
from peers import Peer
from peers.testing import Inbox, running_bus, scaled

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas" / "json"


# push_window


def test_a_plain_subscription_pushes_everything():
    """Any subscription without options, among others, pushes at once."""
    assert push_window([PLAIN], 0.1) == 0
    assert push_window([PushOptions(debounce_ms=100), PLAIN], None) == 0


def test_min_relevance_skips_only_rated_messages_below_it():
    """Below the threshold: skipped; at or above it, or unrated: pushed."""
    picky = [PushOptions(min_relevance=0.5)]
    assert push_window(picky, 0.49) is None
    assert push_window(picky, 0.5) == 0
    assert push_window(picky, None) == 0


def test_the_shortest_window_among_the_wanting_subscriptions_applies():
    """Debounced subscriptions that want the message: the shortest window; those whose
    threshold refuses it do not count."""
    options = [
        PushOptions(debounce_ms=900),
        PushOptions(debounce_ms=300),
        PushOptions(debounce_ms=50, min_relevance=0.9),
    ]
    assert push_window(options, 0.5) == 300
    assert push_window(options, 0.95) == 50
    assert push_window([], 0.5) is None


# Debounce


def test_debounce_pushes_the_first_holds_the_rest_then_pushes_the_latest():
    """One push per window: the first at once, the latest held one when the window ends,
    with how many it replaced; a new window starts with that push."""
    debounce: Debounce[str] = Debounce()
    assert debounce.offer("t", "m1", 1.0, now=0.0).push
    assert debounce.offer("t", "m2", 1.0, now=0.1) == (False, 1.0)
    assert debounce.offer("t", "m3", 1.0, now=0.2) == (False, None)
    assert debounce.offer("other", "o1", 1.0, now=0.2).push
    assert debounce.due("t", now=1.0) == ("m3", 1)
    assert debounce.due("t", now=1.0) is None
    assert debounce.offer("t", "m4", 1.0, now=1.5) == (False, 2.0)
    assert debounce.offer("t", "m5", 1.0, now=2.5).push is False  # flush due: replaces m4
    assert debounce.due("t", now=2.5) == ("m5", 1)
    assert debounce.offer("t", "m6", 1.0, now=3.6).push


def test_debounce_pushes_rather_than_holds_when_full():
    """Past max_topics, ended windows are dropped; if none ended, a new topic is pushed."""
    debounce: Debounce[str] = Debounce(max_topics=2)
    assert debounce.offer("a", "x", 1.0, now=0.0).push
    assert debounce.offer("b", "x", 1.0, now=0.0).push
    assert debounce.offer("c", "x", 1.0, now=0.5).push  # no room, nothing ended: untracked
    assert len(debounce) == 2
    assert debounce.offer("c", "y", 1.0, now=0.6).push  # still untracked: pushed again
    assert debounce.offer("c", "z", 1.0, now=1.5).push  # a and b ended: c gets a window
    assert len(debounce) == 1
    assert debounce.offer("c", "w", 1.0, now=1.6).push is False


@given(st.lists(st.floats(min_value=0, max_value=0.99), min_size=1, max_size=40))
def test_debounce_never_pushes_twice_within_a_window_and_accounts_for_every_message(gaps):
    """Whatever the arrival times: pushes of one topic are at least a window apart, and every
    message is pushed or counted in the skipped of a later push (or still held)."""
    debounce: Debounce[int] = Debounce()
    window, now, flush_at = 1.0, 0.0, None
    pushes: list[tuple[float, int]] = []  # (time, messages it stands for)
    for n, gap in enumerate(gaps):
        now += gap
        if flush_at is not None and flush_at <= now:
            due = debounce.due("t", flush_at)
            assert due is not None
            pushes.append((flush_at, 1 + due[1]))
            flush_at = None
        offer = debounce.offer("t", n, window, now)
        if offer.push:
            pushes.append((now, 1))
        elif offer.flush_at is not None:
            flush_at = offer.flush_at
    held = debounce.due("t", flush_at) if flush_at is not None else None
    times = [t for t, _ in pushes]
    assert all(
        later - earlier >= window - 1e-9 for earlier, later in zip(times, times[1:], strict=False)
    )
    assert sum(count for _, count in pushes) + (1 + held[1] if held else 0) == len(gaps)


# On a real bus


def _valid(name: str, instance: Any) -> None:
    schema = json.loads((SCHEMAS / f"{name}.json").read_text(encoding="utf-8"))
    assert [e.message for e in Draft202012Validator(schema).iter_errors(instance)] == []


async def _send(tg: Peer, relevance: float | None = None, n: int = 0) -> dict[str, Any]:
    """Send a tg_message to agent:w1, rated ``relevance`` if given."""
    payload: dict[str, Any] = {
        "messageId": f"m-{n}-{relevance}",
        "type": "tg_message",
        "from": tg.client_id,
        "timestamp": "2026-11-21T20:22:35Z",
        "content": {"n": n},
    }
    if relevance is not None:
        payload["relevance"] = relevance
    result: dict[str, Any] = await tg.request(
        "sendMessage", {"topic": "agent:w1", "payload": payload}
    )
    return result


async def test_list_subscriptions_names_each_pattern_with_its_options(tmp_path):
    """listSubscriptions answers the connection's patterns, sorted, with debounceMs and
    minRelevance (0 when unset); a second subscribe changes the options; the answer satisfies
    its schema."""
    async with running_bus(tmp_path) as h, h.peer("agent:w1") as agent:
        await agent.request(
            "subscribe", {"topic": "agent:w1", "debounceMs": 250, "minRelevance": 0.5}
        )
        listed = await agent.request("listSubscriptions")
        _valid("listSubscriptions.result", listed)
        assert listed == {
            "subscriptions": [{"topic": "agent:w1", "debounceMs": 250, "minRelevance": 0.5}]
        }
        await agent.subscribe("agent:w1")
        [info] = await agent.list_subscriptions()
        assert (info.topic, info.debounce_ms, info.min_relevance) == ("agent:w1", 0, 0.0)
        await agent.unsubscribe("agent:w1")
        assert await agent.list_subscriptions() == []
        await h.log.commit()
        row = h.rows(event="subscribe", actor="agent:w1")[0]
        assert json.loads(row["payload_json"]) == {"debounceMs": 250, "minRelevance": 0.5}


async def test_subscribe_refuses_options_out_of_range(tmp_path):
    """A negative or too long debounceMs, or a minRelevance outside [0, 1], is -32602."""
    async with running_bus(tmp_path) as h, h.peer("agent:w1") as agent:
        for options in ({"debounceMs": -1}, {"debounceMs": 86_400_001}, {"minRelevance": 1.5}):
            with pytest.raises(InvalidParams):
                await agent.request("subscribe", {"topic": "agent:w1", **options})


async def test_min_relevance_pushes_only_what_is_rated_high_enough(tmp_path):
    """Below minRelevance: not pushed (a push_skipped row), still fetchable; at or above it, or
    unrated: pushed."""
    async with running_bus(tmp_path) as h:
        inbox = Inbox()
        async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg:
            agent.handle(None, inbox)
            await agent.subscribe("agent:w1", min_relevance=0.5)
            low = await _send(tg, 0.2)
            high = await _send(tg, 0.7)
            unrated = await _send(tg, None)
            assert (low["deliveredTo"], high["deliveredTo"], unrated["deliveredTo"]) == (0, 1, 1)
            assert [m.epoch for m in inbox.messages] == [high["epoch"], unrated["epoch"]]
            fetched = await agent.fetch("agent:w1", agent.server_info.epoch)
            assert [m.epoch for m in fetched.messages] == [
                low["epoch"],
                high["epoch"],
                unrated["epoch"],
            ]
        (skipped,) = h.rows(event="push_skipped")
        assert (skipped["actor"], skipped["status"]) == ("agent:w1", "min_relevance")
        assert skipped["epoch"] == low["epoch"]


async def test_debounce_pushes_the_first_then_the_latest_with_skipped(tmp_path):
    """Messages on a debounced topic: the first is pushed at once, the others held; when the
    window ends the latest is pushed with skipped = how many others were not. All fetchable."""
    async with running_bus(tmp_path) as h:
        inbox = Inbox()
        async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg:
            agent.handle(None, inbox)
            await agent.subscribe("agent:w1", debounce_ms=int(scaled(400)))
            results = await asyncio.gather(*(_send(tg, n=n) for n in range(4)))
            epochs = sorted(result["epoch"] for result in results)
            first = await inbox.get()
            last = await inbox.get()
            assert (first.epoch, first.skipped) == (epochs[0], None)
            assert (last.epoch, last.skipped) == (epochs[-1], 2)
            assert sum(result["deliveredTo"] for result in results) == 1
            fetched = await agent.fetch("agent:w1", agent.server_info.epoch)
            assert [m.epoch for m in fetched.messages] == epochs
        statuses = [row["status"] for row in h.rows(event="push_skipped")]
        assert statuses == ["debounce"] * 3
        (late,) = h.rows(event="process_start", status="debounced, skipped 2")
        assert late["epoch"] == epochs[-1]


async def test_a_held_push_is_dropped_when_the_subscription_goes(tmp_path, monkeypatch):
    """A message held by a debounce window is not pushed once the peer unsubscribed."""
    async with running_bus(tmp_path) as h:
        inbox = Inbox()
        flushed, pushed = asyncio.Event(), list[Any]()
        real_flush = h.bus._fanout.deliveries._flush_held

        def flush(*args: Any) -> None:
            real_flush(*args)
            flushed.set()

        def push_held(*args: Any) -> Any:  # called, to make its coroutine, when one is pushed
            pushed.append(args)
            return asyncio.sleep(0)

        monkeypatch.setattr(h.bus._fanout.deliveries, "_flush_held", flush)
        monkeypatch.setattr(h.bus._fanout.deliveries, "_push_held", push_held)
        async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg:
            agent.handle(None, inbox)
            await agent.subscribe("agent:w1", debounce_ms=int(scaled(200)))
            await _send(tg, n=1)
            assert (await _send(tg, n=2))["deliveredTo"] == 0  # held
            await agent.unsubscribe("agent:w1")
            async with asyncio.timeout(scaled(5)):
                await flushed.wait()
        assert pushed == [] and len(inbox.messages) == 1
