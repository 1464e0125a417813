"""Scenario 8: ``POST /v1/messages`` over HTTP against ``sendMessage`` over WebSocket.

One bus (``bcpbus serve --http-port 0``: default policy, limits and audit log), one subscriber
process (``agent:bench``, the SDK over WebSocket) and, in turn, three publishers of ``tg_message``
from ``tg:bench``, each keeping ``window`` requests in flight:

- ``ws``: the SDK's ``sendMessage``, answered once delivered (scenario 1's publisher);
- ``post``: ``POST /v1/messages?wait=true`` with httpx (one keep-alive connection per request in
  flight), answered once delivered: the same work as ``ws`` through the HTTP binding;
- ``post202``: ``POST /v1/messages``, answered 202 once accepted; delivery goes on after.

A second bus without ``--http-port`` (so without the metrics hooks) runs the ``ws`` publisher
too, interleaved, to measure what the metrics cost a WebSocket message. Headline figures are
ratios within each rep: post/ws and post202/ws requests/s, and ws with metrics / ws without.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from .clients import filler
from .common import (
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
from .delivery import measure_windows

__all__ = ["Options", "options", "publisher", "report", "run"]

PUBLISHER, SUBSCRIBER, TOPIC, TYPE = "tg:bench", "agent:bench", "agent:bench", "tg_message"
MODES = ("ws", "post", "post202", "ws_no_metrics")


@dataclass(frozen=True)
class Options:
    """How much to run: repetitions, messages per window, the windows, the event loop."""

    reps: int = 3
    count: int = 5_000
    warmup: int = 500
    windows: tuple[int, ...] = (1, 16)
    payload_bytes: int = 200
    loop: str = "asyncio"

    @classmethod
    def quick(cls, loop: str = "asyncio") -> Options:
        return cls(reps=1, count=100, warmup=20, windows=(1,), loop=loop)


def options(quick: bool, loop: str) -> Options:
    """The full run, or a tiny one that only checks that everything starts and finishes."""
    return Options.quick(loop) if quick else Options(loop=loop)


async def _with_http(directory: Path, options: Options) -> dict[str, Any]:
    """ws, post and post202 against one bus with the HTTP binding."""
    tokens = make_peers(directory / "peers.yaml", {PUBLISHER: [], SUBSCRIBER: []})
    figures: dict[str, Any] = {}
    async with running_bus(directory, loop=options.loop, http=True) as srv:
        assert srv.http_url is not None
        subscriber = await _subscriber(srv.url, tokens, directory)
        try:
            for mode in ("ws", "post", "post202"):
                publisher = await _publisher(
                    mode, srv.url, srv.http_url, tokens, options, directory
                )
                try:
                    figures[mode] = await measure_windows(
                        srv,
                        publisher,
                        {"subscriber": subscriber},
                        windows=options.windows,
                        count=options.count,
                        warmup=options.warmup,
                    )
                finally:
                    await publisher.stop()
                if mode == "post202":
                    # Its deliveries may still be going on: let the bus catch up.
                    await asyncio.sleep(0.5)
        finally:
            await subscriber.stop()
    return figures


async def _without_http(directory: Path, options: Options) -> dict[str, Any]:
    tokens = make_peers(directory / "peers.yaml", {PUBLISHER: [], SUBSCRIBER: []})
    async with running_bus(directory, loop=options.loop) as srv:
        subscriber = await _subscriber(srv.url, tokens, directory)
        publisher = await _publisher("ws", srv.url, None, tokens, options, directory)
        try:
            return {
                "ws_no_metrics": await measure_windows(
                    srv,
                    publisher,
                    {"subscriber": subscriber},
                    windows=options.windows,
                    count=options.count,
                    warmup=options.warmup,
                )
            }
        finally:
            await publisher.stop()
            await subscriber.stop()


async def _subscriber(url: str, tokens: Mapping[str, str], directory: Path) -> Any:
    return await spawn_worker(
        "subscriber",
        "subscribers",
        {"url": url, "peers": [[SUBSCRIBER, tokens[SUBSCRIBER]]], "topic": TOPIC},
        directory,
    )


async def _publisher(
    mode: str,
    url: str,
    http_url: str | None,
    tokens: Mapping[str, str],
    options: Options,
    directory: Path,
) -> Any:
    params = {
        "url": url,
        "http_url": http_url,
        "client_id": PUBLISHER,
        "token": tokens[PUBLISHER],
        "topic": TOPIC,
        "type": TYPE,
        "payload_bytes": options.payload_bytes,
        "wait": mode == "post",
        "loop": options.loop,
    }
    role = "publisher" if mode == "ws" else "http_publisher"
    return await spawn_worker(f"publisher-{mode}", role, params, directory)


async def run(options: Options) -> dict[str, Any]:
    """Run the modes, the two buses interleaved rep by rep; return samples and summary."""
    samples: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
        for rep in range(options.reps):
            parts = (_with_http, _without_http) if rep % 2 == 0 else (_without_http, _with_http)
            for number, part in enumerate(parts):
                directory = Path(tmp) / f"rep{rep}-{number}"
                directory.mkdir()
                for mode, figures in (await part(directory, options)).items():
                    samples[mode].append(figures)
                    print(f"  rep {rep + 1}/{options.reps} {mode}: {_brief(figures)}", flush=True)
    return {"options": asdict(options), "samples": samples, "summary": _summary(samples, options)}


def _brief(figures: Mapping[str, Mapping[str, float]]) -> str:
    return ", ".join(
        f"w{w} {f['msgs_per_s']:,.0f}/s {f['server_cpu_us']:.0f} us/msg" for w, f in figures.items()
    )


def _summary(samples: Mapping[str, Sequence[Any]], options: Options) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for window in map(str, options.windows):
        entry: dict[str, Any] = {
            mode: {
                key: summarize(s[window][key] for s in samples[mode])
                for key in ("msgs_per_s", "p50_ms", "p99_ms", "server_cpu_us", "misses")
            }
            for mode in MODES
        }
        ws = samples["ws"]
        for name, mode, base in (
            ("post/ws", "post", ws),
            ("post202/ws", "post202", ws),
            ("ws/ws_no_metrics", "ws", samples["ws_no_metrics"]),
        ):
            pairs = list(zip(samples[mode], base, strict=True))
            entry[f"{name} msgs"] = summarize(
                a[window]["msgs_per_s"] / b[window]["msgs_per_s"] for a, b in pairs
            )
            entry[f"{name} cpu"] = summarize(
                a[window]["server_cpu_us"] / b[window]["server_cpu_us"]
                for a, b in pairs
                if b[window]["server_cpu_us"]
            )
        summary[window] = entry
    return summary


def report(result: Mapping[str, Any]) -> str:
    """The results as Markdown tables."""
    rows = [
        [
            mode,
            window,
            spread(entry[mode]["msgs_per_s"]),
            spread(entry[mode]["p50_ms"]),
            spread(entry[mode]["p99_ms"]),
            spread(entry[mode]["server_cpu_us"]),
            entry[mode]["misses"]["max"],
        ]
        for window, entry in result["summary"].items()
        for mode in MODES
    ]
    headers = ["publisher", "window", "req/s", "p50 ms", "p99 ms", "bus CPU us/msg", "misses"]
    ratios = [
        [window, name, spread(entry[f"{name} msgs"], _ratio), spread(entry[f"{name} cpu"], _ratio)]
        for window, entry in result["summary"].items()
        for name in ("post/ws", "post202/ws", "ws/ws_no_metrics")
    ]
    return (
        table(headers, rows) + "\n\n" + table(["window", "ratio", "req/s", "bus CPU/msg"], ratios)
    )


def _ratio(value: float) -> str:
    return f"{value:.2f}x"


# The worker


async def publisher(params: dict[str, Any]) -> None:
    """POST on command, as :func:`bench.clients.publisher` sends: ``run WINDOW COUNT WARMUP``,
    ``go``, ``quit``. ``wait`` in ``params`` posts with ``?wait=true``."""
    path = "/v1/messages?wait=true" if params["wait"] else "/v1/messages"
    body = {
        "topic": params["topic"],
        "type": params["type"],
        "content": filler(params["client_id"], params["type"], params["payload_bytes"]),
    }
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(
        base_url=params["http_url"],
        headers={"Authorization": f"Bearer {params['token']}"},
        limits=limits,
        timeout=60.0,
        trust_env=False,
    ) as client:
        emit("ready")
        commands = stdin_lines()
        async for words in commands:
            if words[0] == "quit":
                break
            window, count, warmup = (int(w) for w in words[1:4])
            await _blast(client, path, body, warmup, window, params["wait"])
            emit("warm")
            await anext(commands)  # go
            cpu, start = time.process_time(), time.perf_counter()
            latencies, misses = await _blast(client, path, body, count, window, params["wait"])
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
            emit(
                "done",
                elapsed=elapsed,
                cpu=cpu,
                misses=misses,
                p50=percentile(latencies, 50),
                p99=percentile(latencies, 99),
            )


async def _blast(
    client: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    count: int,
    window: int,
    wait: bool,
) -> tuple[list[float], int]:
    """POST ``count`` messages, ``window`` at a time; return the latencies and the misses
    (an error status, or ``deliveredTo`` 0 with ``wait``)."""
    latencies: list[float] = []
    misses = 0
    left = count

    async def lane() -> None:
        nonlocal left, misses
        while left > 0:
            left -= 1
            start = time.perf_counter()
            try:
                response = await client.post(path, json=body)
            except httpx.HTTPError:
                misses += 1
                continue
            latencies.append(time.perf_counter() - start)
            if response.status_code not in (200, 202) or (
                wait and not response.json().get("deliveredTo")
            ):
                misses += 1

    async with asyncio.TaskGroup() as group:
        for _ in range(window):
            group.create_task(lane())
    return latencies, misses
