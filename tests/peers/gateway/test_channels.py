"""Every channel a reader has into a controller, played by an attacker on a real bus.

Each test has a hostile reader encode a secret in one channel (invisible characters on a flag
channel, the timing of answers and pushes, the number of failed retries, when it takes a query)
and a controller-side decoder read it back from what it receives. What the decoder can tell
apart must be paid for: grouping the runs by what the decoder read, each group charged the
least any of its runs was, the groups must satisfy Kraft's inequality (``sum 2**-charge <=
1``). A decoder that tells 8 secrets apart from deliveries charged nothing fails it (8 > 1);
one that reads only the grid slot, which is charged in a prefix code, passes.

The readers' ``asyncio.sleep`` calls are the attack itself (when to answer), not synchronization.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Hashable, Iterable
from pathlib import Path
from typing import Any

import pytest

from peers import Message, QueryFailed, Reply
from peers.testing import Inbox, running_bcp, scaled

from .test_flows import Pair, agents

YES_NO = {
    "category": 2,
    "questions": [
        {"id": "ok", "question": "Is it out?", "max_words": 1, "expected_format": "yes_no"}
    ],
}
BOOLEAN = {"category": 1, "fields": [{"name": "ok", "type": "boolean"}]}
QUANTUM = 0.2
PUSHES = """    subscriptions:
      - id: pings
        category: 1
        fields:
          - {name: ok, type: boolean}
        min_interval_s: 0.05
"""


def kraft(runs: Iterable[tuple[Hashable, float]]) -> float:
    """Return ``sum 2**-charge`` over what the decoder read, each at its cheapest run."""
    cheapest: dict[Hashable, float] = {}
    for decoded, charged in runs:
        cheapest[decoded] = min(charged, cheapest.get(decoded, charged))
    return sum(2.0**-charge for charge in cheapest.values())


def channel(tmp_path: Path, **options: Any) -> Path:
    return agents(tmp_path, max_category=2, budget=100_000, max_cat2=1000, **options)


async def test_invisible_characters_on_a_flag_channel_tell_the_controller_only_codes(tmp_path):
    """A reader puts a zero-width space at the index of its secret; the controller gets the
    same codes whatever the index, and pays for them."""
    directory = channel(tmp_path, anomaly="flag", quantum=0)
    runs = []
    async with running_bcp(tmp_path, agents_dir=directory) as h, Pair(h) as p:
        for secret in range(8):
            where, count = secret % 4, 1 + secret // 4
            text = "yes"[:where] + "\u200b" * count + "yes"[where:]
            p.reader.on_query(_answers({"ok": text}))
            delivery = await p.main.ask("researcher", YES_NO, timeout=scaled(10))
            frame = delivery.model_dump(
                mode="json", exclude={"delivery_id", "query_id", "provenance"}
            )
            assert "index" not in json.dumps(frame) and "U+" not in json.dumps(frame)
            assert [(a.code, a.field) for a in delivery.anomalies] == [("invisible", "ok")]
            # The decoder reads everything the frame says but its ids.
            assert delivery.bits is not None
            runs.append((json.dumps(frame, sort_keys=True), delivery.bits.value))
    assert len({decoded for decoded, _ in runs}) == 1
    assert kraft(runs) <= 1


async def _answer_timing_runs(tmp_path: Path, quantum: float) -> list[tuple[Hashable, float]]:
    """Answer secret s after s quarters of a grid step; decode the step from the latency."""
    directory = channel(tmp_path, quantum=quantum)
    runs: list[tuple[Hashable, float]] = []
    step = QUANTUM / 4
    async with running_bcp(tmp_path, agents_dir=directory) as h, Pair(h) as p:
        for secret in range(8):

            async def late(query: dict[str, Any], secret: int = secret) -> Any:
                await asyncio.sleep(secret * step)  # the attack: when to answer
                return {"ok": True}

            p.reader.on_query(late)
            start = time.monotonic()
            delivery = await p.main.ask("researcher", BOOLEAN, timeout=scaled(10))
            elapsed = time.monotonic() - start
            assert delivery.bits is not None
            # The decoder reads as finely as the channel allows: a quarter step without a grid,
            # the step with one (finer readings of a gridded delivery are the bus's noise).
            runs.append((round(elapsed / (step if not quantum else quantum)), delivery.bits.timing))
    return runs


async def test_answer_timing_is_released_on_the_grid_and_charged(tmp_path):
    """Answering early or late moves only the grid slot, which is charged; without the grid
    the same decoder reads the secrets for nothing."""
    (tmp_path / "off").mkdir()
    (tmp_path / "on").mkdir()
    free = await _answer_timing_runs(tmp_path / "off", 0)
    assert all(charged == 0 for _, charged in free)
    assert kraft(free) > 1  # the channel is real: timing alone told secrets apart
    gridded = await _answer_timing_runs(tmp_path / "on", QUANTUM)
    assert all(charged >= 2 for _, charged in gridded)
    assert kraft(gridded) <= 1


async def test_retries_do_not_show_in_latency(tmp_path):
    """0, 1 or 2 failed tries before a valid answer: the delivery leaves on the grid, and the
    decoder that reads the retry count from the latency reads only the (charged) slot."""
    directory = channel(tmp_path, quantum=QUANTUM)
    runs = []
    async with running_bcp(tmp_path, agents_dir=directory) as h, Pair(h) as p:
        for secret in (0, 1, 2) * 3:

            async def retry(query: dict[str, Any], secret: int = secret) -> Any:
                for _ in range(secret):
                    verdict = await p.reader.answer("main", query["query_id"], {"ok": "maybe"})
                    assert verdict.error == "validation_failed"
                return {"ok": True}

            p.reader.on_query(retry)
            start = time.monotonic()
            delivery = await p.main.ask("researcher", BOOLEAN, timeout=scaled(10))
            assert delivery.bits is not None
            # A 5 ms resolution read the retries on a bus without the grid (5-11 ms apart).
            runs.append((round((time.monotonic() - start) / 0.005), delivery.bits.timing))
    # Readings finer than the grid are noise: group them by the slot they fall in.
    slots = [(round(decoded * 0.005 / QUANTUM), charged) for decoded, charged in runs]
    assert kraft(slots) <= 1


async def test_push_timing_is_released_on_the_grid_and_charged(tmp_path):
    """A reader times each push after the subscription allows it; the controller reads the
    gaps between deliveries, and each push paid its slot and that it came at all."""
    directory = channel(tmp_path, quantum=QUANTUM, subscriptions=PUSHES)
    pushed = Inbox()
    runs = []
    async with running_bcp(tmp_path, agents_dir=directory) as h, Pair(h) as p:
        p.main.on_delivery(pushed)  # type: ignore[arg-type]
        previous = None
        for secret in (3, 0, 6, 1, 5, 2, 7, 4):
            await asyncio.sleep(0.05 + secret * QUANTUM / 4)  # the attack: when to push
            verdict = await p.reader.publish("pings", "main", {"ok": True})
            assert verdict.success, verdict.detail
            async with asyncio.timeout(scaled(10)):
                delivery = await pushed.get()
            now = time.monotonic()
            if previous is not None:
                bits = delivery["bits"]
                assert bits["outcome"] == 1 and bits["timing"] >= 2
                runs.append((round((now - previous) / QUANTUM), bits["timing"] + bits["outcome"]))
            previous = now
    assert kraft(runs) <= 1


async def test_a_reader_holding_a_query_does_not_time_the_controllers_request(tmp_path):
    """A reader that answers the bus's processMessage for bcp_query when it likes would set how
    long the controller's sendMessage takes (up to process_timeout, at any grain): the
    controller is answered first, and a query the reader then refuses fails on the grid,
    its slot charged."""
    directory = channel(tmp_path, quantum=QUANTUM)
    async with running_bcp(tmp_path, agents_dir=directory) as h, Pair(h) as p:
        taken, release = asyncio.Event(), asyncio.Event()

        async def holding(message: Message) -> Reply:
            taken.set()
            await release.wait()  # the attack: answer processMessage at a moment of its choice
            return Reply(False, "not_now")

        p.reader.peer.handle("bcp_query", holding)
        async with asyncio.timeout(scaled(10)):
            _, result = await p.main.send_query("researcher", BOOLEAN, query_id="q-held")
            assert result.delivered_to == 1  # the gateway took it; the reader still holds it
            await taken.wait()
            release.set()
            with pytest.raises(QueryFailed) as failed:
                await p.main.ask("researcher", BOOLEAN)
            assert failed.value.reason == "reader_unavailable"
        rows = [json.loads(r["payload_json"]) for r in p.rows(event="bcp_query_failed")]
        assert len(rows) == 2 and all(r["split"]["timing"] >= 2 for r in rows), rows


async def test_admission_shows_a_query_settled_only_when_its_outcome_leaves(tmp_path):
    """A controller probing with queries it expects refused reads when the budget left grows:
    a query's refund comes when its delivery leaves on the grid, not when the reader answered,
    so the probe sees only the (charged) slot. Meanwhile a concurrent query is refused
    budget_exhausted, and admitted once the first one's outcome is delivered."""
    directory = agents(tmp_path, max_category=2, budget=20, quantum=2.0)
    async with running_bcp(tmp_path, agents_dir=directory) as h, Pair(h) as p:
        p.reader.on_query(_answers({"ok": True}, {"ok": True}))
        first = asyncio.create_task(p.main.ask("researcher", BOOLEAN, timeout=scaled(20)))
        async with asyncio.timeout(scaled(10)):
            verdict = await p.reader.next_result()
        assert verdict.success  # validated, and waiting for its grid point 2 s after the ask
        assert not first.done()
        with pytest.raises(QueryFailed) as probe:
            await p.main.ask("researcher", BOOLEAN, query_id="probe-1", timeout=scaled(10))
        assert probe.value.reason == "budget_exhausted"
        assert "queries in flight hold reserves" in probe.value.detail, probe.value.detail
        delivery = await first
        assert delivery.response == {"ok": True}
        again = await p.main.ask("researcher", BOOLEAN, query_id="probe-2", timeout=scaled(20))
        assert again.response == {"ok": True}


def _answers(*responses: Any) -> Any:
    queue = list(responses)

    async def handler(query: dict[str, Any]) -> Any:
        return queue.pop(0) if queue else None

    return handler
