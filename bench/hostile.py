"""The bus's memory under two hostile peers, for any source tree: a before/after measurement.

    python -m bench.hostile slow  [--tree DIR] [--seconds 60]
    python -m bench.hostile flood [--tree DIR] [--seconds 60]
    python -m bench.hostile large [--tree DIR] [--senders 192] [--config FILE]

``slow``: ``agent:stall`` logs in and never reads (tiny kernel buffers on its socket), and
``tg:pub`` keeps 2,000 messages of 64 KiB in flight to it. ``flood``: ``tg:pipe`` pipelines ``ping``
requests as fast as it can and never reads an answer. ``large``: ``--senders`` peers each send one
message of 900 KiB at once to ``agent:stall``, which reads every frame and answers none, so every
message stays in flight until ``process_timeout`` (or ``--config``'s). Each way the bus
(``bcpbus serve --no-gateway`` with its default limits, run from ``--tree``, default this
checkout) is sampled every second: resident memory (VmRSS), and what the attackers saw. Run it
once on the tree before a change and once after (``git worktree add /tmp/before REV``);
everything stays on 127.0.0.1, and every loop ends by ``--seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from .common import rss_bytes

__all__ = ["LARGE", "large", "login", "main", "measure", "serve", "tokens_for"]

HERE = Path(__file__).resolve().parents[1]
MIB = 1 << 20
WINDOW = 2_000
"""``sendMessage`` requests the slow case keeps in flight (the bus answers past its limits)."""


def _bcpbus(tree: Path, *args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from peers.cli import main; sys.exit(main())", *args]


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


def _token(tree: Path, peers_file: Path, client_id: str) -> str:
    import subprocess

    out = subprocess.run(
        _bcpbus(tree, "peers", "--peers-file", str(peers_file), "add", client_id),
        env=_env(tree),
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    match = re.search(r"bcpbus_\S+", out)
    if match is None:
        raise RuntimeError(f"no token in {out!r}")
    return match.group(0)


@contextlib.asynccontextmanager
async def serve(
    tree: Path, directory: Path, config: Path | None = None
) -> AsyncIterator[tuple[int, str]]:
    """Run ``bcpbus serve --no-gateway`` from ``tree`` with its files in ``directory`` (peers
    in ``peers.yaml``) and ``config``; yield its process id and ``ws://`` URL, stop it after."""
    peers = directory / "peers.yaml"
    argv = _bcpbus(
        tree, "serve", "--port", "0", "--no-gateway", "--db", str(directory / "log.db"),
        "--peers-file", str(peers), "--loop", "asyncio",
    )  # fmt: skip
    if config is not None:
        argv += ["--config", str(config)]
    child = await asyncio.create_subprocess_exec(
        *argv,
        cwd=tree,
        env=_env(tree),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert child.stdout is not None
    try:
        async with asyncio.timeout(30):
            while True:
                line = (await child.stdout.readline()).decode()
                if not line:
                    raise RuntimeError("bcpbus serve exited before listening")
                match = re.search(r"listening on (ws://\S+)", line)
                if match:
                    break
        drain = asyncio.create_task(child.stdout.read())
        yield child.pid, match.group(1)
    finally:
        if child.returncode is None:
            child.terminate()
            try:
                async with asyncio.timeout(30):
                    await child.wait()
            except TimeoutError:
                child.kill()
                await child.wait()
        with contextlib.suppress(Exception):
            drain.cancel()


def _tiny_socket(url: str) -> socket.socket:
    host, port = url.removeprefix("ws://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sock.connect((host, int(port)))
    sock.setblocking(False)
    return sock


async def login(url: str, client_id: str, token: str, **kwargs: Any) -> ClientConnection:
    """Connect to ``url`` and initialize as ``client_id``; ``kwargs`` go to ``connect``."""
    ws = await connect(url, max_size=None, **kwargs)
    params = {"clientId": client_id, "auth": {"token": token}}
    await ws.send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}))
    await ws.recv()
    return ws


async def _slow(url: str, tokens: dict[str, str], until: float, seen: dict[str, int]) -> None:
    stall = await login(url, "agent:stall", tokens["agent:stall"], sock=_tiny_socket(url))
    stall.transport.pause_reading()  # never read again
    pub = await login(url, "tg:pub", tokens["tg:pub"])
    content = {"text": "x" * (64 << 10)}
    ids = iter(range(10**9))
    answers: asyncio.Queue[str] = asyncio.Queue()

    async def reader() -> None:
        with contextlib.suppress(ConnectionClosed):
            async for text in pub:
                answers.put_nowait(str(text))

    read = asyncio.create_task(reader())
    in_flight = 0
    try:
        while time.monotonic() < until:
            while in_flight < WINDOW:
                n = next(ids)
                payload = {"messageId": f"m-{n}", "type": "tg_message", "from": "tg:pub",
                           "timestamp": "2026-11-23T00:00:00Z", "content": content}  # fmt: skip
                params = {"topic": "agent:stall", "payload": payload}
                await pub.send(json.dumps({"jsonrpc": "2.0", "id": n + 1, "method": "sendMessage",
                                           "params": params}))  # fmt: skip
                in_flight += 1
                seen["sent"] += 1
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, until - time.monotonic())):
                    text = await answers.get()
                    in_flight -= 1
                    seen["error" if '"error"' in text else "answered"] += 1
    finally:
        read.cancel()
        stall.transport.abort()
        await pub.close()


async def _flood(url: str, tokens: dict[str, str], until: float, seen: dict[str, int]) -> None:
    ws = await login(url, "tg:pipe", tokens["tg:pipe"], sock=_tiny_socket(url))
    ws.transport.pause_reading()  # never read an answer
    frame = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    try:
        while time.monotonic() < until:
            try:
                async with asyncio.timeout(max(0.01, until - time.monotonic())):
                    await ws.send(frame)
                seen["sent"] += 1
            except TimeoutError:
                seen["send_blocked"] += 1
                break
            except ConnectionClosed:
                seen["closed"] += 1
                break
    finally:
        ws.transport.abort()


LARGE = 900 << 10
"""Characters of content in each message of the ``large`` case."""


def tokens_for(peers_file: Path, client_ids: Sequence[str]) -> dict[str, str]:
    """Tokens for many peers at once, written to ``peers_file`` (one ``peers add`` each would
    start a process per peer)."""
    from bus.ops.credentials import Credentials

    credentials = Credentials.load(peers_file) if peers_file.exists() else Credentials()
    tokens = {cid: credentials.add(cid, []) for cid in client_ids}
    credentials.save(peers_file)
    return tokens


def _large_frame(sender: str, n: int) -> str:
    payload = {"messageId": f"{sender}-{n}", "type": "tg_message", "from": sender,
               "timestamp": "2026-11-23T00:00:00Z", "content": {"text": "x" * LARGE}}  # fmt: skip
    params = {"topic": "agent:stall", "payload": payload}
    return json.dumps({"jsonrpc": "2.0", "id": n, "method": "sendMessage", "params": params})


async def large(url: str, tokens: dict[str, str], seen: dict[str, int]) -> None:
    """``agent:stall`` reads every frame and answers none; every other peer in ``tokens`` sends
    one message of :data:`LARGE` characters to it at once and waits for its answer, counted in
    ``seen`` by outcome (``answered`` or the error code). Returns once all are answered."""
    stall = await login(url, "agent:stall", tokens["agent:stall"])
    drop = asyncio.create_task(_read_all(stall))
    senders = [cid for cid in tokens if cid != "agent:stall"]
    # One at a time: sockets not yet initialized are capped per address (HTTP 503 past it).
    links = [await login(url, cid, tokens[cid]) for cid in senders]

    async def send(ws: ClientConnection, sender: str) -> None:
        await ws.send(_large_frame(sender, 1))
        reply = json.loads(await ws.recv())
        key = "answered" if "result" in reply else str(reply["error"]["code"])
        seen[key] = seen.get(key, 0) + 1

    try:
        await asyncio.gather(*(send(ws, cid) for ws, cid in zip(links, senders, strict=True)))
    finally:
        drop.cancel()
        await asyncio.gather(*(ws.close() for ws in [stall, *links]), return_exceptions=True)


async def _read_all(ws: ClientConnection) -> None:
    with contextlib.suppress(ConnectionClosed):
        async for _ in ws:
            pass


async def _measure_large(tree: Path, senders: int, config: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bcpbus-hostile-") as tmp:
        directory = Path(tmp)
        ids = ["agent:stall", *(f"tg:flood{i}" for i in range(senders))]
        tokens = tokens_for(directory / "peers.yaml", ids)
        async with serve(tree, directory, config) as (pid, url):
            start_rss = rss_bytes(pid)
            seen: dict[str, int] = {}
            attack = asyncio.create_task(large(url, tokens, seen))
            samples: list[float] = []
            began = time.monotonic()
            while not attack.done():
                samples.append(rss_bytes(pid) / MIB)
                await asyncio.wait({attack}, timeout=0.5)
            await attack
            took = time.monotonic() - began
            if os.environ.get("HOSTILE_TRACE"):
                print(" ".join(f"{mib:.0f}" for mib in samples), file=sys.stderr)
            await asyncio.sleep(2.0)  # let the bus free what it held
            after = rss_bytes(pid) / MIB
    return {
        "case": "large",
        "tree": str(tree),
        "senders": senders,
        "payload_in_flight_mib": round(senders * LARGE / MIB, 1),
        "seconds": round(took, 1),
        "rss_start_mib": round(start_rss / MIB, 1),
        "rss_max_mib": round(max(samples), 1),
        "rss_after_mib": round(after, 1),
        "seen": seen,
    }


async def measure(case: str, tree: Path, seconds: float) -> dict[str, Any]:
    """Run one case against ``bcpbus serve`` from ``tree``; return the RSS samples and counts."""
    with tempfile.TemporaryDirectory(prefix="bcpbus-hostile-") as tmp:
        directory = Path(tmp)
        tokens = {
            cid: _token(tree, directory / "peers.yaml", cid)
            for cid in ("agent:stall", "tg:pub", "tg:pipe")
        }
        async with serve(tree, directory) as (pid, url):
            start_rss = rss_bytes(pid)
            seen: dict[str, int] = {"sent": 0, "answered": 0, "error": 0, "send_blocked": 0}
            seen.setdefault("closed", 0)
            until = time.monotonic() + seconds
            attack = asyncio.create_task(
                (_slow if case == "slow" else _flood)(url, tokens, until, seen)
            )
            samples: list[tuple[float, float]] = []
            began = time.monotonic()
            while not attack.done() or time.monotonic() < until:
                samples.append((time.monotonic() - began, rss_bytes(pid) / MIB))
                await asyncio.wait({attack}, timeout=1.0)
                if time.monotonic() >= until + 5:
                    break
            await attack
            samples.append((time.monotonic() - began, rss_bytes(pid) / MIB))
            rows = _rows(directory / "log.db")
    rss = [mib for _, mib in samples]
    return {
        "case": case,
        "tree": str(tree),
        "seconds": seconds,
        "rss_start_mib": round(start_rss / MIB, 1),
        "rss_max_mib": round(max(rss), 1),
        "rss_end_mib": round(rss[-1], 1),
        "seen": seen,
        "log": rows,
    }


def _rows(db: Path) -> dict[str, int]:
    """The bus's own account: delivery outcomes and the rows of its defences."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        query = (
            "SELECT event || ':' || coalesce(status, ''), count(*) FROM activity_log "
            "WHERE event IN ('process_finish', 'slow_consumer', 'disconnect', 'limit_exceeded') "
            "GROUP BY 1"
        )
        return {key: count for key, count in conn.execute(query)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__)
    parser.add_argument("case", choices=("slow", "flood", "large"))
    parser.add_argument("--tree", type=Path, default=HERE, help="source tree to run the bus from")
    parser.add_argument("--seconds", type=float, default=60.0, help="attack duration")
    parser.add_argument("--senders", type=int, default=192, help="large: peers sending at once")
    parser.add_argument("--config", type=Path, help="large: the bus's config file (limits)")
    options = parser.parse_args(argv)
    tree = options.tree.resolve()
    if options.case == "large":
        result = asyncio.run(_measure_large(tree, options.senders, options.config))
    else:
        result = asyncio.run(measure(options.case, tree, options.seconds))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
