"""Scenario 3: the BCP round trip, controller query -> gateway -> reader -> gateway -> controller.

Three processes: ``bcpbus serve`` with its in-process gateway (its default, on the in-memory
link of :mod:`bus.transports.local`), a controller (:class:`peers.bcp.Controller`, ``agent:main``)
and a reader (:class:`peers.bcp.Reader`, ``agent:researcher``) that answers every query at once with
a valid answer. The controller keeps ``window`` :meth:`~peers.bcp.Controller.ask` calls in
flight; one query is five ``sendMessage`` calls through the bus (query request, query,
response, validation result, delivery), each with its audit rows committed, plus the gateway's
own rows.

The agent definitions give the channel a budget no run can spend, so every query is admitted.
Figures per category and window: queries/s, p50 and p99 of one ``ask``, and the bus process's
CPU time per query (bus and gateway together: they share the process).

The baseline beside it, rep by rep in alternating order: the bare relay (:mod:`bench.relay`)
carrying five acknowledged deliveries per query (``relay5``: the SDK publisher of scenario 1
sending ``5 x count`` messages of :data:`HOP_BYTES` with the same window, each lane's five
consecutive sends one query). Its queries/s is its messages/s over five, its CPU per query the
relay's CPU for five messages; the report gives each case's queries/s over it, per rep.

The cases run on the channel as shipped, whose outcomes leave on the ``delivery_quantum`` grid
(0.1 s: a query at window 1 takes at least one grid step), and Cat-1 again on a channel with
the grid off (``cat1-nogrid``): the difference is what the timing channel's closing costs.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from peers.bcp import Controller, Reader
from peers.client import Peer
from peers.demo.run import CAT1, CAT2  # the reference specs, as the demo asks them
from schemas.agents import DEFAULT_DELIVERY_QUANTUM

from . import delivery
from .common import (
    Child,
    cpu_seconds,
    emit,
    make_peers,
    percentile,
    running_bus,
    spawn_worker,
    spread,
    stdin_lines,
    summarize,
    table,
)

__all__ = ["Options", "controller", "options", "reader", "report", "run"]

SPECS = {1: CAT1, 2: CAT2}
HOPS = 5
"""Acknowledged deliveries in one query: request, query, response, validation, delivery."""
HOP_BYTES = 600
"""The size of one relayed message in the baseline: about a BCP query's envelope."""
ANSWERS: dict[int, dict[str, Any]] = {
    1: {"has_pricing": True, "tier": "pro", "rating": 4, "region": "eu"},
    2: {"company": "Acme Corp", "founded": "1998-04-01"},
}

_AGENT = """---
name: {name}
bcp_channels:
  - peer: {peer}
    role: {role}
    max_category: 2
    budget_bits: 1.0e+15
    delivery_quantum: {quantum}
---
{name}
"""


@dataclass(frozen=True)
class Options:
    """Repetitions, queries per (category, window), the windows, the categories, the loop."""

    reps: int = 3
    count: int = 2_000
    warmup: int = 200
    windows: tuple[int, ...] = (1, 64)
    categories: tuple[int, ...] = (1, 2)
    ungridded: tuple[int, ...] = (1,)
    """Categories also run on a channel without the delivery grid (``delivery_quantum: 0``):
    what the grid costs."""
    loop: str = "asyncio"


def options(quick: bool, loop: str) -> Options:
    """The full run, or a tiny one that only checks that everything starts and finishes."""
    if quick:
        return Options(reps=1, count=40, warmup=10, loop=loop)
    return Options(loop=loop)


def write_agents(directory: Path, quantum: float = DEFAULT_DELIVERY_QUANTUM) -> Path:
    """Agent definitions for one controller-reader channel with a budget no run exhausts and
    deliveries on a grid of ``quantum`` seconds (0: no grid)."""
    agents = directory / "agents"
    agents.mkdir()
    (agents / "main.md").write_text(
        _AGENT.format(name="main", peer="researcher", role="controller", quantum=quantum)
    )
    (agents / "researcher.md").write_text(
        _AGENT.format(name="researcher", peer="main", role="reader", quantum=quantum)
    )
    return agents


# The worker roles


async def _asks(ctl: Controller, category: int, count: int, window: int) -> list[float]:
    latencies: list[float] = []
    left = count
    spec = SPECS[category]

    async def lane() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            start = time.perf_counter()
            await ctl.ask("researcher", spec, query_id=f"q-{uuid.uuid4().hex}", timeout=60)
            latencies.append(time.perf_counter() - start)

    async with asyncio.TaskGroup() as group:
        for _ in range(window):
            group.create_task(lane())
    return latencies


async def controller(params: dict[str, Any]) -> None:
    """Ask on command: ``run CATEGORY WINDOW COUNT WARMUP``, then ``go``; ``quit`` ends."""
    ctl = Controller(Peer(params["url"], "agent:main", params["token"], reconnect=False))
    await ctl.start()
    emit("ready")
    commands = stdin_lines()
    try:
        async for words in commands:
            if words[0] == "quit":
                break
            category, window, count, warmup = (int(w) for w in words[1:5])
            await _asks(ctl, category, warmup, window)
            emit("warm")
            await anext(commands)  # go
            cpu, start = time.process_time(), time.perf_counter()
            latencies = await _asks(ctl, category, count, window)
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
            p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
            emit("done", elapsed=elapsed, cpu=cpu, p50=p50, p99=p99)
    finally:
        await ctl.close()


async def reader(params: dict[str, Any]) -> None:
    """Answer every query at once with a valid answer for its category; ``quit`` ends."""
    rdr = Reader(Peer(params["url"], "agent:researcher", params["token"], reconnect=False))

    @rdr.on_query
    async def answer(query: dict[str, Any]) -> dict[str, Any]:
        return ANSWERS[int(query["category"])]

    await rdr.start()
    emit("ready")
    try:
        async for words in stdin_lines():
            if words[0] == "quit":
                break
    finally:
        await rdr.close()


# The orchestrator


async def _one(
    directory: Path, options: Options, categories: tuple[int, ...], quantum: float
) -> dict[str, dict[str, float]]:
    """One bus with its gateway on a channel whose grid is ``quantum``; figures per case."""
    tokens = make_peers(directory / "peers.yaml", {"agent:main": [], "agent:researcher": []})
    agents = write_agents(directory, quantum)
    suffix = "" if quantum else "-nogrid"
    figures: dict[str, dict[str, float]] = {}
    async with running_bus(directory, gateway=True, agents_dir=agents, loop=options.loop) as bus:
        rdr = await spawn_worker(
            "reader", "reader", {"url": bus.url, "token": tokens["agent:researcher"]}, directory
        )
        ctl = await spawn_worker(
            "controller", "controller", {"url": bus.url, "token": tokens["agent:main"]}, directory
        )
        try:
            for category in categories:
                for window in options.windows:
                    case = f"cat{category}{suffix}/w{window}"
                    figures[case] = await _case(bus.pid, rdr.pid, ctl, options, category, window)
        finally:
            await ctl.stop()
            await rdr.stop()
    return figures


async def _case(
    bus: int, reader: int, ctl: Child, options: Options, category: int, window: int
) -> dict[str, float]:
    await ctl.send("run", category, window, options.count, options.warmup)
    await ctl.expect("warm")
    before = cpu_seconds(bus), cpu_seconds(reader)
    await ctl.send("go")
    done = await ctl.expect("done")
    after = cpu_seconds(bus), cpu_seconds(reader)
    return {
        "queries_per_s": options.count / done["elapsed"],
        "p50_ms": done["p50"] * 1e3,
        "p99_ms": done["p99"] * 1e3,
        "bus_cpu_us": (after[0] - before[0]) / options.count * 1e6,
        "reader_cpu_us": (after[1] - before[1]) / options.count * 1e6,
        "controller_cpu_us": done["cpu"] / options.count * 1e6,
    }


async def _bus(directory: Path, options: Options) -> dict[str, dict[str, float]]:
    """The shipped channel (deliveries on the 0.1 s grid), then the ungridded categories."""
    (directory / "grid").mkdir()
    figures = await _one(directory / "grid", options, options.categories, DEFAULT_DELIVERY_QUANTUM)
    if options.ungridded:
        (directory / "nogrid").mkdir()
        figures |= await _one(directory / "nogrid", options, options.ungridded, 0.0)
    return figures


async def _relay5(directory: Path, options: Options) -> dict[str, dict[str, float]]:
    """The baseline: the relay carrying ``HOPS`` deliveries a query, at the same windows."""
    hops = delivery.Options(
        reps=1,
        count=options.count * HOPS,
        warmup=options.warmup * HOPS,
        windows=options.windows,
        payload_bytes=HOP_BYTES,
        loop=options.loop,
    )
    figures = await delivery.one("relay", directory, hops)
    return {
        f"relay5/w{window}": {
            "queries_per_s": f["msgs_per_s"] / HOPS,
            "p50_ms": f["p50_ms"] * HOPS,
            "p99_ms": f["p99_ms"] * HOPS,
            "bus_cpu_us": f["server_cpu_us"] * HOPS,
            "reader_cpu_us": f["subscriber_cpu_us"] * HOPS,
            "controller_cpu_us": f["publisher_cpu_us"] * HOPS,
        }
        for window, f in ((int(w), f) for w, f in figures.items())
    }


async def _rep(directory: Path, options: Options, rep: int) -> dict[str, dict[str, float]]:
    """One rep of the bus cases and the baseline, who goes first alternating by rep."""
    (directory / "bus").mkdir()
    (directory / "relay").mkdir()
    if rep % 2 == 0:
        bus = await _bus(directory / "bus", options)
        relay = await _relay5(directory / "relay", options)
    else:
        relay = await _relay5(directory / "relay", options)
        bus = await _bus(directory / "bus", options)
    ratios = {
        case: {
            "vs_relay5": f["queries_per_s"] / relay[f"relay5/{case.split('/')[1]}"]["queries_per_s"]
        }
        for case, f in bus.items()
    }
    return {case: {**f, **ratios[case]} for case, f in bus.items()} | relay


async def run(options: Options) -> dict[str, Any]:
    """Run scenario 3 and its baseline; return the samples and their summary."""
    samples: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-bcp-") as tmp:
        for rep in range(options.reps):
            directory = Path(tmp) / f"rep-{rep}"
            directory.mkdir()
            samples.append(await _rep(directory, options, rep))
            brief = ", ".join(f"{k} {v['queries_per_s']:,.0f} q/s" for k, v in samples[-1].items())
            print(f"  rep {rep + 1}/{options.reps}: {brief}", flush=True)
    summary = {
        case: {key: summarize(s[case][key] for s in samples) for key in samples[0][case]}
        for case in samples[0]
    }
    return {"options": asdict(options), "samples": samples, "summary": summary}


def report(result: Mapping[str, Any]) -> str:
    """The results as a Markdown table: each bus case's queries/s over the baseline's, per rep."""
    headers = [
        "case",
        "queries/s",
        "vs relay5",
        "p50 ms",
        "p99 ms",
        "server CPU us/query",
        "reader CPU us/q",
    ]
    rows = [
        [
            case,
            spread(f["queries_per_s"]),
            spread(f["vs_relay5"], _ratio) if "vs_relay5" in f else "1",
            spread(f["p50_ms"]),
            spread(f["p99_ms"]),
            spread(f["bus_cpu_us"]),
            f["reader_cpu_us"]["median"],
        ]
        for case, f in result["summary"].items()
    ]
    return table(headers, rows)


def _ratio(value: float) -> str:
    return f"{value:.2f}x"
