"""Scenario 4: fan-out, one publisher to 100 subscribers, through the bus and the baseline relay.

The publisher (``bench:pub``) sends ``bench_event`` to ``bench:fan``; 100 SDK peers
(``bench:s000``...), spread over a few processes, subscribe to it. A ``sendMessage`` is answered
once all 100 have answered their ``processMessage``. The default policy has no role that lets
many peers share a topic, so the bus runs a small benchmark policy (one role, ``bench:*``); the
relay runs beside it, interleaved, as in scenario 2.

Figures per window: deliveries/s (messages/s x subscribers), p50 and p99 of one ``sendMessage``,
and the server's CPU time per delivery.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .common import Child, make_peers, spawn_worker, spread, summarize, table
from .delivery import measure_windows, server

__all__ = ["POLICY", "Options", "options", "report", "run"]

POLICY = """version: 1
roles:
  bench:
    description: Benchmark peers; any of them may publish to and subscribe to bench:*.
    members: ["bench:*"]
    send:
      - types: [bench_event]
        topics: ["bench:*"]
    subscribe: ["bench:*"]
"""
PUBLISHER, TOPIC, TYPE = "bench:pub", "bench:fan", "bench_event"
TARGETS = ("bus", "relay")


@dataclass(frozen=True)
class Options:
    """Repetitions, subscribers and their processes, messages per window, windows, loop."""

    reps: int = 3
    subscribers: int = 100
    processes: int = 4
    count: int = 500
    warmup: int = 50
    windows: tuple[int, ...] = (1, 16)
    payload_bytes: int = 200
    loop: str = "asyncio"


def options(quick: bool, loop: str) -> Options:
    """The full run, or a tiny one that only checks that everything starts and finishes."""
    if quick:
        return Options(reps=1, subscribers=10, processes=2, count=20, warmup=5, loop=loop)
    return Options(loop=loop)


async def _subscribers(
    url: str, tokens: Mapping[str, str], options: Options, directory: Path
) -> list[Child]:
    names = [f"bench:s{i:03d}" for i in range(options.subscribers)]
    children = []
    for index in range(options.processes):
        mine = names[index :: options.processes]
        params = {"url": url, "peers": [[n, tokens[n]] for n in mine], "topic": TOPIC}
        children.append(
            await spawn_worker(f"subscribers-{index}", "subscribers", params, directory)
        )
    return children


async def _one(target: str, directory: Path, options: Options) -> dict[str, dict[str, float]]:
    ids = [PUBLISHER, *(f"bench:s{i:03d}" for i in range(options.subscribers))]
    tokens = make_peers(directory / "peers.yaml", {i: [] for i in ids})
    (directory / "policy.yaml").write_text(POLICY)
    async with server(target, directory, options.loop, policy=directory / "policy.yaml") as srv:
        subscribers = await _subscribers(srv.url, tokens, options, directory)
        params = {
            "url": srv.url,
            "client_id": PUBLISHER,
            "token": tokens[PUBLISHER],
            "topic": TOPIC,
            "type": TYPE,
            "payload_bytes": options.payload_bytes,
        }
        publisher = await spawn_worker("publisher", "publisher", params, directory)
        try:
            figures = await measure_windows(
                srv,
                publisher,
                {},
                windows=options.windows,
                count=options.count,
                warmup=options.warmup,
            )
        finally:
            await publisher.stop()
            for child in subscribers:
                await child.stop()
    n = options.subscribers
    return {
        window: {
            "deliveries_per_s": f["msgs_per_s"] * n,
            "p50_ms": f["p50_ms"],
            "p99_ms": f["p99_ms"],
            "server_cpu_us": f["server_cpu_us"] / n,
        }
        for window, f in figures.items()
    }


async def run(options: Options) -> dict[str, Any]:
    """Run scenario 4 against the bus and the relay, interleaved; return samples and summary."""
    samples: dict[str, list[dict[str, dict[str, float]]]] = {t: [] for t in TARGETS}
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp:
        for rep in range(options.reps):
            for target in TARGETS if rep % 2 == 0 else TARGETS[::-1]:
                directory = Path(tmp) / f"{target}-{rep}"
                directory.mkdir()
                samples[target].append(await _one(target, directory, options))
                brief = ", ".join(
                    f"w{w} {f['deliveries_per_s']:,.0f} deliveries/s"
                    for w, f in samples[target][-1].items()
                )
                print(f"  rep {rep + 1}/{options.reps} {target}: {brief}", flush=True)
    summary: dict[str, Any] = {}
    for window in map(str, options.windows):
        summary[window] = {
            target: {
                key: summarize(s[window][key] for s in samples[target])
                for key in samples[target][0][window]
            }
            for target in TARGETS
        }
        summary[window]["ratio"] = summarize(
            b[window]["deliveries_per_s"] / r[window]["deliveries_per_s"]
            for b, r in zip(samples["bus"], samples["relay"], strict=True)
        )
    return {"options": asdict(options), "samples": samples, "summary": summary}


def report(result: Mapping[str, Any]) -> str:
    """The results as a Markdown table."""
    headers = ["server", "window", "deliveries/s", "p50 ms", "p99 ms", "server CPU us/delivery"]
    rows = []
    for window, entry in result["summary"].items():
        for target in TARGETS:
            f = entry[target]
            rows.append(
                [
                    target,
                    window,
                    spread(f["deliveries_per_s"]),
                    spread(f["p50_ms"]),
                    spread(f["p99_ms"]),
                    spread(f["server_cpu_us"]),
                ]
            )
        rows.append(
            ["bus/relay", window, spread(entry["ratio"], lambda v: f"{v:.2f}x"), "", "", ""]
        )
    return table(headers, rows)
