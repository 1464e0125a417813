"""Scenario 5: 10,000 authenticated idle peers; the bus's memory per peer and the time to connect.

``bcpbus serve`` runs with default limits (``max_connections`` 20,000) and a peers file of
10,000 credentials (``agent:idle-00000``...). Worker processes of 2,500 SDK peers each connect
and initialize them, 32 at a time per process, and then hold them idle. Each worker connects from
its own loopback address (127.0.0.2, 127.0.0.3...): the bus lets one address hold at most
``max_anonymous_per_address`` (32) connections that have not initialized yet. The bus's resident
memory (``VmRSS``) is read before the first connection and after the last one, once the bus has
gone idle again (its presence announcements drained); the difference divided by the number of
peers is the memory per peer.

The open-file limit is raised to its hard limit first (the bus needs one descriptor per peer).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect as ws_connect

from bus.ops.config import DEFAULT_MAX_ANONYMOUS_PER_ADDRESS
from bus.transports.local import Socket
from peers.client import Peer

from .common import (
    Child,
    cpu_seconds,
    emit,
    make_peers,
    rss_bytes,
    running_bus,
    spawn_worker,
    spread,
    stdin_lines,
    summarize,
    table,
)

__all__ = ["Options", "idlers", "options", "report", "run"]

MIB = 1 << 20


@dataclass(frozen=True)
class Options:
    """Repetitions, peers, peers per worker process, connects in flight per process, loop."""

    reps: int = 3
    peers: int = 10_000
    per_process: int = 2_500
    concurrency: int = DEFAULT_MAX_ANONYMOUS_PER_ADDRESS
    loop: str = "asyncio"
    transport: str = "websockets"
    """The bus's ``serve --transport``."""


def options(quick: bool, loop: str) -> Options:
    """The full run, or a tiny one that only checks that everything starts and finishes."""
    if quick:
        return Options(reps=1, peers=100, per_process=50, concurrency=16, loop=loop)
    return Options(loop=loop)


async def idlers(params: dict[str, Any]) -> None:
    """On ``go``, connect every ``[clientId, token]`` of ``peers``, report ``connected``, idle
    until ``quit``."""
    url, source = params["url"], (params["address"], 0)

    async def connector() -> Socket:
        return await ws_connect(url, compression=None, max_size=None, local_addr=source)

    peers = [
        Peer(url, cid, token, reconnect=False, connector=connector)
        for cid, token in params["peers"]
    ]
    slots = asyncio.Semaphore(params["concurrency"])
    failures = 0

    async def join(peer: Peer) -> None:
        nonlocal failures
        async with slots:
            try:
                await peer.connect()
            except Exception:
                failures += 1

    emit("ready")
    commands = stdin_lines()
    try:
        await anext(commands)  # go
        start = time.perf_counter()
        await asyncio.gather(*(join(p) for p in peers))
        emit("connected", elapsed=time.perf_counter() - start, failures=failures)
        async for words in commands:
            if words[0] == "quit":
                break
    finally:
        await asyncio.gather(*(p.close() for p in peers), return_exceptions=True)


async def _settle(pid: int, *, quiet: float = 0.02, limit: float = 120.0) -> None:
    """Wait until process ``pid`` uses less than ``quiet`` CPU seconds in a half second."""
    deadline = time.monotonic() + limit
    last = cpu_seconds(pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = cpu_seconds(pid)
        if now - last < quiet:
            return
        last = now


async def _workers(
    url: str, tokens: Mapping[str, str], options: Options, directory: Path
) -> list[Child]:
    ids = list(tokens)
    size = options.per_process
    children = []
    for index, first in enumerate(range(0, len(ids), size)):
        params = {
            "url": url,
            "peers": [[cid, tokens[cid]] for cid in ids[first : first + size]],
            "concurrency": options.concurrency,
            "address": f"127.0.0.{index + 2}",
        }
        children.append(await spawn_worker(f"idlers-{index}", "idlers", params, directory))
    return children


async def _one(directory: Path, options: Options) -> dict[str, float]:
    ids = [f"agent:idle-{i:05d}" for i in range(options.peers)]
    tokens = make_peers(directory / "peers.yaml", {cid: [] for cid in ids})
    async with running_bus(directory, loop=options.loop, transport=options.transport) as bus:
        await _settle(bus.pid)
        rss_before, cpu_before = rss_bytes(bus.pid), cpu_seconds(bus.pid)
        workers = await _workers(bus.url, tokens, options, directory)
        try:
            start = time.perf_counter()
            for worker in workers:
                await worker.send("go")
            reports = [await w.expect("connected") for w in workers]
            elapsed = time.perf_counter() - start
            await _settle(bus.pid)
            rss_after, cpu_after = rss_bytes(bus.pid), cpu_seconds(bus.pid)
        finally:
            for worker in workers:
                await worker.stop()
    return {
        "connect_s": elapsed,
        "connects_per_s": options.peers / elapsed,
        "failures": sum(r["failures"] for r in reports),
        "rss_before_mib": rss_before / MIB,
        "rss_after_mib": rss_after / MIB,
        "kib_per_peer": (rss_after - rss_before) / options.peers / 1024,
        "bus_cpu_ms_per_connect": (cpu_after - cpu_before) / options.peers * 1e3,
    }


async def run(options: Options) -> dict[str, Any]:
    """Run scenario 5; return the samples and their summary."""
    samples: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-connections-") as tmp:
        for rep in range(options.reps):
            directory = Path(tmp) / f"rep-{rep}"
            directory.mkdir()
            samples.append(await _one(directory, options))
            s = samples[-1]
            print(
                f"  rep {rep + 1}/{options.reps}: {s['connect_s']:.1f} s, "
                f"{s['rss_after_mib']:.0f} MiB, {s['kib_per_peer']:.1f} KiB/peer",
                flush=True,
            )
    summary = {key: summarize(s[key] for s in samples) for key in samples[0]}
    return {"options": asdict(options), "samples": samples, "summary": summary}


def report(result: Mapping[str, Any]) -> str:
    """The results as a Markdown table."""
    s = result["summary"]
    peers = result["options"]["peers"]
    rows = [
        ["idle peers", f"{peers:,}"],
        ["time to connect all (s)", spread(s["connect_s"])],
        ["connects/s", spread(s["connects_per_s"])],
        ["failed connects", spread(s["failures"])],
        ["bus RSS before (MiB)", spread(s["rss_before_mib"])],
        ["bus RSS with all peers (MiB)", spread(s["rss_after_mib"])],
        ["bus RSS per peer (KiB)", spread(s["kib_per_peer"])],
        ["bus CPU per connect (ms)", spread(s["bus_cpu_ms_per_connect"])],
    ]
    return table(["figure", "median (min-max)"], rows)
