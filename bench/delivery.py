"""Scenarios 1 and 2: acknowledged delivery through the bus, and the baseline relay beside it.

One publisher process -> server process -> one subscriber process, all on 127.0.0.1. The
publisher (the SDK) keeps ``window`` ``sendMessage`` calls in flight; each is answered after the
subscriber's ``processMessage`` reply. The server is the bus (``bcpbus serve``: default policy,
limits and audit log; ``tg:bench`` sends ``tg_message`` to ``agent:bench``) or the baseline relay
(:mod:`bench.relay`). The two alternate within one run, rep by rep and in alternating order, so
both see the same machine; the headline is the ratio bus/relay of each rep, summarized.

Figures per window: messages/s, p50 and p99 latency of one ``sendMessage``, and the server
process's CPU time per message (all its threads, from ``/proc``; the SQLite writer thread
included).
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .common import (
    Child,
    Server,
    cpu_seconds,
    make_peers,
    running_bus,
    running_relay,
    spawn_worker,
    spread,
    summarize,
    table,
)

__all__ = ["Options", "measure_windows", "one", "options", "report", "run", "server"]

PUBLISHER, SUBSCRIBER, TOPIC, TYPE = "tg:bench", "agent:bench", "agent:bench", "tg_message"
TARGETS = ("bus", "relay")


@dataclass(frozen=True)
class Options:
    """How much to run: repetitions, messages per window, the windows, the event loop."""

    reps: int = 3
    count: int = 20_000
    warmup: int = 1_000
    windows: tuple[int, ...] = (1, 64)
    payload_bytes: int = 200
    loop: str = "asyncio"
    transport: str = "websockets"
    """The bus's ``serve --transport``; the relay is always websockets."""

    @classmethod
    def quick(cls, loop: str = "asyncio") -> Options:
        return cls(reps=1, count=300, warmup=50, loop=loop)


def options(quick: bool, loop: str) -> Options:
    """The full run, or a tiny one that only checks that everything starts and finishes."""
    return Options.quick(loop) if quick else Options(loop=loop)


def server(
    target: str,
    directory: Path,
    loop: str,
    *,
    policy: Path | None = None,
    transport: str = "websockets",
) -> AbstractAsyncContextManager[Server]:
    """The bus (with ``policy``, else the built-in one; served by ``transport``) or the relay,
    run in ``directory``."""
    if target == "bus":
        return running_bus(directory, loop=loop, policy=policy, transport=transport)
    return running_relay(directory, loop=loop)


async def measure_windows(
    srv: Server,
    publisher: Child,
    watched: Mapping[str, Child],
    *,
    windows: Sequence[int],
    count: int,
    warmup: int,
) -> dict[str, dict[str, float]]:
    """Run each window on a started publisher; return figures per window.

    CPU per message is read from ``/proc`` for the server and each ``watched`` child around the
    measured part only (the warm-up is excluded).
    """
    figures: dict[str, dict[str, float]] = {}
    for window in windows:
        await publisher.send("run", window, count, warmup)
        await publisher.expect("warm")
        pids = {"server": srv.pid, **{name: c.pid for name, c in watched.items()}}
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        await publisher.send("go")
        done = await publisher.expect("done")
        after = {name: cpu_seconds(pid) for name, pid in pids.items()}
        figures[str(window)] = {
            "msgs_per_s": count / done["elapsed"],
            "p50_ms": done["p50"] * 1e3,
            "p99_ms": done["p99"] * 1e3,
            "misses": done["misses"],
            "publisher_cpu_us": done["cpu"] / count * 1e6,
            **{f"{name}_cpu_us": (after[name] - before[name]) / count * 1e6 for name in pids},
        }
    return figures


async def one(target: str, directory: Path, options: Options) -> dict[str, dict[str, float]]:
    """One rep of ``target`` (``bus`` or ``relay``) at every window: figures per window."""
    tokens = make_peers(directory / "peers.yaml", {PUBLISHER: [], SUBSCRIBER: []})
    async with server(target, directory, options.loop, transport=options.transport) as srv:
        subscriber = await spawn_worker(
            "subscriber",
            "subscribers",
            {"url": srv.url, "peers": [[SUBSCRIBER, tokens[SUBSCRIBER]]], "topic": TOPIC},
            directory,
        )
        publisher = await spawn_worker(
            "publisher",
            "publisher",
            {
                "url": srv.url,
                "client_id": PUBLISHER,
                "token": tokens[PUBLISHER],
                "topic": TOPIC,
                "type": TYPE,
                "payload_bytes": options.payload_bytes,
            },
            directory,
        )
        try:
            return await measure_windows(
                srv,
                publisher,
                {"subscriber": subscriber},
                windows=options.windows,
                count=options.count,
                warmup=options.warmup,
            )
        finally:
            await publisher.stop()
            await subscriber.stop()


async def _reps(options: Options, root: Path) -> AsyncIterator[tuple[int, str, dict[str, Any]]]:
    for rep in range(options.reps):
        # Alternate who goes first, so neither always runs on a warmer (or hotter) machine.
        order = TARGETS if rep % 2 == 0 else TARGETS[::-1]
        for target in order:
            directory = root / f"{target}-{rep}"
            directory.mkdir()
            yield rep, target, await one(target, directory, options)


async def run(options: Options) -> dict[str, Any]:
    """Run scenarios 1 and 2 interleaved; return the samples and their summary."""
    samples: dict[str, list[dict[str, dict[str, float]]]] = {t: [] for t in TARGETS}
    with tempfile.TemporaryDirectory(prefix="bench-delivery-") as tmp:
        async for rep, target, figures in _reps(options, Path(tmp)):
            samples[target].append(figures)
            print(f"  rep {rep + 1}/{options.reps} {target}: {_brief(figures)}", flush=True)
    return {"options": asdict(options), "samples": samples, "summary": _summary(samples, options)}


def _brief(figures: Mapping[str, Mapping[str, float]]) -> str:
    return ", ".join(
        f"w{w} {f['msgs_per_s']:,.0f} msg/s {f['server_cpu_us']:.0f} us/msg"
        for w, f in figures.items()
    )


def _summary(
    samples: Mapping[str, Sequence[Mapping[str, Mapping[str, float]]]], options: Options
) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    keys = [k for k in samples["bus"][0][str(options.windows[0])] if k != "misses"]
    for window in map(str, options.windows):
        entry: dict[str, Any] = {
            target: {key: summarize(s[window][key] for s in samples[target]) for key in keys}
            | {"misses": sum(s[window]["misses"] for s in samples[target])}
            for target in TARGETS
        }
        pairs = list(zip(samples["bus"], samples["relay"], strict=True))
        entry["ratio_msgs"] = summarize(
            b[window]["msgs_per_s"] / r[window]["msgs_per_s"] for b, r in pairs
        )
        # A --quick run may read zero clock ticks of relay CPU: leave that pair out of the ratio.
        entry["ratio_cpu"] = summarize(
            b[window]["server_cpu_us"] / r[window]["server_cpu_us"]
            for b, r in pairs
            if r[window]["server_cpu_us"]
        )
        summary[window] = entry
    return summary


def report(result: Mapping[str, Any]) -> str:
    """The results as Markdown tables."""
    rows = []
    for window, entry in result["summary"].items():
        for target in TARGETS:
            f = entry[target]
            rows.append(
                [
                    target,
                    window,
                    spread(f["msgs_per_s"]),
                    spread(f["p50_ms"]),
                    spread(f["p99_ms"]),
                    spread(f["server_cpu_us"]),
                    f["subscriber_cpu_us"]["median"],
                    f["publisher_cpu_us"]["median"],
                    entry[target]["misses"],
                ]
            )
    headers = [
        "server",
        "window",
        "msgs/s",
        "p50 ms",
        "p99 ms",
        "server CPU us/msg",
        "sub CPU us/msg",
        "pub CPU us/msg",
        "misses",
    ]
    ratios = [
        [w, spread(e["ratio_msgs"], _ratio), spread(e["ratio_cpu"], _ratio)]
        for w, e in result["summary"].items()
    ]
    return (
        table(headers, rows)
        + "\n\n"
        + table(["window", "msgs/s bus/relay", "CPU/msg bus/relay"], ratios)
    )


def _ratio(value: float) -> str:
    return f"{value:.2f}x"
