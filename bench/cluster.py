"""Scenario 12: bus nodes on NATS (``serve --cluster``) against NATS request/reply alone.

One ``nats-server -js`` and, in turn, 1, 2 and 3 ``bcpbus serve --cluster`` nodes (no gateway,
no checkpoints, the cluster tests' policy). For n nodes there are n publishers and n subscribers
(SDK peers over WebSocket), one of each per node; publisher i sends ``note`` to the subscriber
on node i+1 (mod n), so with two nodes or more every message crosses NATS, and waits for its
``sendMessage`` answer (delivered and answered on the other node) with ``window`` requests in
flight. A single bus with no ``--cluster`` runs the same load, for what the cluster link costs
on one node. The baseline is NATS alone with the same kind of clients: n requesters and n
responders (nats-py, one connection each), requester i calling responder i+1 with
``request()`` and the same window. Figures: acknowledged messages per second over all
publishers, and the round trip per message (p50, p99).

All processes share this machine: with two cores the nodes, the NATS server and the clients
compete for them, so adding nodes here adds work without adding cores (bench/README.md).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bus.ops.credentials import Credentials
from peers import Peer

from .common import percentile, table

__all__ = ["Options", "options", "report", "run"]

POLICY = """\
version: 1
roles:
  worker:
    description: Benchmark peers.
    members: ["w:*"]
    send:
      - types: [note]
        topics: ["w:*"]
    subscribe: ["w:{name}"]
"""
BCPBUS = str(Path(sys.executable).with_name("bcpbus"))


@dataclass(frozen=True)
class Options:
    """How much to run: seconds measured per setup (after a warm-up), requests in flight per
    publisher, the node counts, the event loop of the nodes."""

    seconds: float = 5.0
    warmup: float = 1.0
    window: int = 8
    nodes: tuple[int, ...] = (1, 2, 3)
    loop: str = "asyncio"


def options(quick: bool, loop: str) -> Options:
    """The scenario's options; ``quick`` is a tiny load that checks it runs."""
    if quick:
        return Options(seconds=1.0, warmup=0.5, window=2, nodes=(1, 2), loop=loop)
    return Options(loop=loop)


async def run(opts: Options) -> dict[str, Any]:
    """Run every setup once; return the figures per setup, in order."""
    if shutil.which("nats-server") is None:
        raise SystemExit("bench cluster needs nats-server (Debian: apt-get install nats-server)")
    results: dict[str, Any] = {"options": asdict(opts), "setups": {}}
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        root = Path(tmp)
        (root / "policy.yaml").write_text(POLICY)
        async with _nats(root) as nats_url:
            for n in opts.nodes:
                results["setups"][f"nats x{n}"] = await _nats_baseline(nats_url, n, opts)
            results["setups"]["bus, no cluster"] = await _buses(root, None, 1, opts)
            for n in opts.nodes:
                results["setups"][f"{n} node{'s' * (n > 1)}"] = await _buses(
                    root, nats_url, n, opts
                )
    return results


def report(result: dict[str, Any]) -> str:
    """The table of :func:`run`'s figures."""
    rows = [
        (name, f["messages_per_s"], f["p50_ms"], f["p99_ms"])
        for name, f in result["setups"].items()
    ]
    window = result["options"]["window"]
    return table(
        ("setup (publishers = subscribers = n)", "msgs/s", f"p50 ms (window {window})", "p99 ms"),
        rows,
    )


# The load


async def _load(calls: list[Callable[[], Awaitable[Any]]], opts: Options) -> dict[str, float]:
    """Run each call in ``calls`` (one per publisher) ``window`` at a time until the time is up;
    return messages/s and the latency percentiles of the measured part."""
    latencies: list[float] = []
    measuring = False
    stop = False

    async def lane(call: Callable[[], Awaitable[Any]]) -> None:
        while not stop:
            started = time.perf_counter()
            await call()
            if measuring:
                latencies.append(time.perf_counter() - started)

    lanes = [asyncio.create_task(lane(call)) for call in calls for _ in range(opts.window)]
    await asyncio.sleep(opts.warmup)
    measuring, began = True, time.perf_counter()
    await asyncio.sleep(opts.seconds)
    measuring, elapsed = False, time.perf_counter() - began
    count = len(latencies)
    stop = True
    await asyncio.gather(*lanes)
    return {
        "messages": count,
        "messages_per_s": count / elapsed,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
    }


async def _nats_baseline(url: str, n: int, opts: Options) -> dict[str, float]:
    import nats

    async with AsyncExitStack() as stack:
        clients = []
        for _ in range(2 * n):
            client = await nats.connect(url)
            stack.push_async_callback(client.close)
            clients.append(client)
        responders, requesters = clients[:n], clients[n:]
        for i, responder in enumerate(responders):

            async def answer(msg: Any, responder: Any = responder) -> None:
                await responder.publish(msg.reply, b'{"processed":true}')

            await responder.subscribe(f"bench.w{i}", cb=answer)
            await responder.flush()  # the server knows the responder before the first request
        payload = b"x" * 200
        await _until_answered(requesters[0], [f"bench.w{i}" for i in range(n)])
        calls = [
            (lambda r=requester, i=i: r.request(f"bench.w{(i + 1) % n}", payload, timeout=30))
            for i, requester in enumerate(requesters)
        ]
        return await _load(calls, opts)


async def _until_answered(client: Any, subjects: list[str], tries: int = 50) -> None:
    """Ask each subject until it answers: a flushed subscription can still reach the server's
    interest graph a moment after the first request (seen as "no responders" in CI)."""
    from nats.errors import NoRespondersError

    for subject in subjects:
        for attempt in range(tries):
            try:
                await client.request(subject, b"", timeout=5)
                break
            except NoRespondersError:
                if attempt == tries - 1:
                    raise
                await asyncio.sleep(0.1)


async def _buses(base: Path, nats_url: str | None, n: int, opts: Options) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(dir=base))  # each setup's logs start empty
    shutil.copy(base / "policy.yaml", root / "policy.yaml")
    credentials = Credentials.empty()
    tokens = {f"w:{kind}{i}": "" for kind in ("pub", "sub") for i in range(n)}
    for client_id in tokens:
        tokens[client_id] = credentials.add(client_id, [])
    credentials.save(root / "bcpbus-peers.yaml")
    async with AsyncExitStack() as stack:
        urls = [
            await stack.enter_async_context(_node(root, nats_url, f"n{i}", opts.loop))
            for i in range(n)
        ]
        publishers = []
        for i, url in enumerate(urls):
            subscriber = Peer(url, f"w:sub{i}", tokens[f"w:sub{i}"], reconnect=False)

            async def processed(message: Any) -> bool:
                return True

            subscriber.handle(None, processed)
            await stack.enter_async_context(subscriber)
            publishers.append(
                await stack.enter_async_context(
                    Peer(url, f"w:pub{i}", tokens[f"w:pub{i}"], reconnect=False)
                )
            )
        text = "x" * 200
        calls = [
            (lambda p=publisher, i=i: p.send(f"w:sub{(i + 1) % n}", "note", {"text": text}))
            for i, publisher in enumerate(publishers)
        ]
        return await _load(calls, opts)


# The processes


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@asynccontextmanager
async def _nats(root: Path) -> AsyncIterator[str]:
    port = _free_port()
    process = await asyncio.create_subprocess_exec(
        "nats-server",
        *("-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(root / "nats")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        async with asyncio.timeout(30):
            while True:
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                except OSError:
                    await asyncio.sleep(0.05)
                    continue
                writer.close()
                break
        yield f"nats://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        await process.wait()


@asynccontextmanager
async def _node(root: Path, nats_url: str | None, name: str, loop: str) -> AsyncIterator[str]:
    port = _free_port()
    cluster = ("--cluster", nats_url, "--node", name) if nats_url is not None else ()
    process = await asyncio.create_subprocess_exec(
        BCPBUS,
        *("serve", "--port", str(port), "--no-gateway", "--no-checkpoints", "--loop", loop),
        *("--db", f"{name}.db", "--policy", "policy.yaml", *cluster),
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(60):
            line = (await process.stdout.readline()).decode()
        if not line.startswith("listening on "):
            raise SystemExit(f"node {name} did not start: {line!r}")
        yield line.split()[-1]
    finally:
        process.send_signal(signal.SIGTERM)
        await process.wait()
