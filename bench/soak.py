"""Scenario 7: a soak. Many peers talk for a long time, a few misbehave; the bus's memory must
stay flat.

``bcpbus serve`` runs with its default limits. 1,000 SDK peers (``agent:soak-0000``...), 250 to a
worker process, each send ``agent_event`` to a random other one at a modest rate (0.2 messages a
second, exponential gaps) for 10 minutes, and answer what they get. Beside them, one process plays
four misbehaving peers that exercise the bus's defences:

- ``agent:stall`` logs in and stops reading (its socket's receive queue holds one frame);
- ``agent:flood`` sends it 64 KiB messages, 8 a second, so the bus has something to hold for it;
- ``agent:pipe`` pipelines pings and never reads the answers;
- a garbage sender, anonymous or logged in as ``agent:junk``, sends frames that are not JSON,
  lone surrogates, ``NaN``, deep nesting, binary and oversized frames, 20 a second.

Each reconnects when the bus drops it, a bounded number of times. The orchestrator reads the
bus's resident memory (``VmRSS``) every few seconds. Figures: RSS idle (no peers), at the start of
the load, its maximum and at the end; the slope over the second half of the run (least squares,
MiB per minute), which must stay under :data:`FLAT_MIB_PER_MINUTE` for memory to count as flat;
messages sent, answered and delivered, errors by code; what the misbehaving peers saw; and the
bus's own log rows by event, for the refusals. Every loop is bounded in time and in count, so a
run ends by itself. Everything runs on 127.0.0.1.

Connections are opened a few at a time per process (:attr:`Options.concurrency`): the bus allows
32 sockets that have not initialized per address, and every peer here comes from 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from bus.core.errors import BusError
from peers.client import Message, Peer

from .clients import filler
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

__all__ = ["FLAT_MIB_PER_MINUTE", "Options", "misbehavers", "options", "report", "run", "soakers"]

MIB = 1 << 20
FLAT_MIB_PER_MINUTE = 1.0
"""Memory is flat when it grows less than this over the second half of the run."""
TYPE = "agent_event"
MISBEHAVERS = ("agent:stall", "agent:pipe", "agent:flood", "agent:junk")
MAX_RECONNECTS = 1_000
"""Most connections one misbehaving peer opens in a run."""
RECONNECT_DELAY = 0.5


@dataclass(frozen=True)
class Options:
    """Repetitions, peers, seconds, messages per second per peer, peers and connects in flight
    per process, seconds between memory samples, the misbehaving peers' rates, loop."""

    reps: int = 1
    peers: int = 1_000
    duration: float = 600.0
    rate: float = 0.2
    per_process: int = 250
    concurrency: int = 4
    sample_every: float = 5.0
    flood_bytes: int = 64 << 10
    flood_rate: float = 8.0
    garbage_rate: float = 20.0
    loop: str = "asyncio"


def options(quick: bool, loop: str) -> Options:
    """The full run, or a short small one that only checks that everything starts and finishes."""
    if quick:
        return Options(
            peers=20, duration=5.0, rate=2.0, per_process=20, sample_every=0.5, loop=loop
        )
    return Options(loop=loop)


# The well-behaved peers (a worker role)


async def soakers(params: dict[str, Any]) -> None:
    """Connect ``peers`` on ``connect``; on ``go``, send to random others of ``all`` at ``rate``
    for ``duration`` seconds, then report ``done`` with the counts; ``quit`` ends."""
    rate, duration = params["rate"], params["duration"]
    everyone: list[str] = params["all"]
    received = 0

    async def count(message: Message) -> None:
        nonlocal received
        received += 1

    peers = []
    for client_id, token in params["peers"]:
        # The bus waits up to 30 s for a delivery's answer: wait longer for its answer.
        peer = Peer(params["url"], client_id, token, reconnect=False, request_timeout=90)
        peer.handle(None, count)
        peers.append(peer)
    emit("ready")
    commands = stdin_lines()
    try:
        await anext(commands)  # connect
        failures = await _connect_all(peers, params["concurrency"])
        emit("connected", failures=failures)
        await anext(commands)  # go
        stats: Counter[str] = Counter()
        errors: Counter[int] = Counter()
        latencies: list[float] = []
        limit = int(rate * duration * 3) + 10  # a bound on each peer's loop besides the clock

        async def lane(peer: Peer, rng: random.Random) -> None:
            content = filler(peer.client_id, TYPE, 200)
            for _ in range(limit):
                await asyncio.sleep(rng.expovariate(rate))
                target = rng.choice(everyone)
                if target == peer.client_id:
                    continue
                stats["sent"] += 1
                start = time.perf_counter()
                try:
                    result = await peer.send(target, TYPE, content)
                except BusError as exc:
                    errors[exc.code] += 1
                except TimeoutError:
                    stats["timeouts"] += 1
                except ConnectionError:
                    stats["disconnected"] += 1
                    return
                else:
                    stats["answered"] += 1
                    stats["delivered"] += bool(result.delivered_to)
                    latencies.append(time.perf_counter() - start)

        seed = random.Random(params["seed"])
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(duration), asyncio.TaskGroup() as group:
                for peer in peers:
                    if peer.connected.is_set():
                        group.create_task(lane(peer, random.Random(seed.random())))
        emit(
            "done",
            stats=dict(stats),
            errors={str(code): n for code, n in errors.items()},
            received=received,
            latencies=sorted(latencies)[:: max(1, len(latencies) // 2000)],
            still_connected=sum(p.connected.is_set() for p in peers),
        )
        async for words in commands:
            if words[0] == "quit":
                break
    finally:
        await asyncio.gather(*(p.close() for p in peers), return_exceptions=True)


async def _connect_all(peers: Sequence[Peer], concurrency: int) -> int:
    slots = asyncio.Semaphore(concurrency)
    failures = 0

    async def one(peer: Peer) -> None:
        nonlocal failures
        async with slots:
            try:
                await peer.connect()
            except Exception:
                failures += 1

    await asyncio.gather(*(one(p) for p in peers))
    return failures


# The misbehaving peers (a worker role)


class _Tally:
    """What one misbehaving peer did and saw."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.codes: Counter[str] = Counter()
        """Error answers by JSON-RPC code, closes by WebSocket close code."""

    def closed(self, ws: ClientConnection) -> None:
        self.codes[f"close {ws.close_code}"] += 1

    def answer(self, text: str | bytes) -> None:
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            message = json.loads(text)
            for item in message if isinstance(message, list) else [message]:
                error = item.get("error")
                self.codes["result" if error is None else f"error {error.get('code')}"] += 1

    def as_dict(self) -> dict[str, Any]:
        return {**self.counts, **self.codes}


def _initialize(client_id: str, token: str) -> str:
    params = {"clientId": client_id, "auth": {"token": token}}
    return json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params})


@contextlib.asynccontextmanager
async def _stubborn(url: str) -> AsyncIterator[ClientConnection]:
    """A raw connection that stops reading once one frame waits unread, and sends no pings.

    It ends by dropping the TCP connection: a close handshake could wait behind the bytes the
    bus no longer reads, or for a close frame this side never reads.
    """
    ws = await connect(url, max_queue=1, ping_interval=None, compression=None, max_size=None)
    try:
        yield ws
    finally:
        ws.transport.abort()


async def _login(ws: ClientConnection, client_id: str, token: str) -> None:
    await ws.send(_initialize(client_id, token))
    async with asyncio.timeout(30):
        reply = json.loads(await ws.recv())
    if "result" not in reply:
        raise RuntimeError(f"{client_id} could not log in: {reply}")


async def _reconnecting(tally: _Tally, session: Any) -> None:
    """Run ``session(tally)`` on fresh connections until the caller's timeout, a bounded number
    of times."""
    for _ in range(MAX_RECONNECTS):
        try:
            await session(tally)
        except (OSError, InvalidStatus, ConnectionClosed, RuntimeError) as exc:
            tally.codes[type(exc).__name__] += 1
        await asyncio.sleep(RECONNECT_DELAY)


async def _stall(url: str, token: str, tally: _Tally) -> None:
    async with _stubborn(url) as ws:
        await _login(ws, "agent:stall", token)
        tally.counts["connects"] += 1
        # It never reads again: the bus must cope, then drop it. Not reading, this side would
        # not see the bus close the socket; a request now and then (unanswered) finds out.
        for n in range(1_000_000):
            try:
                async with asyncio.timeout(5):
                    await ws.wait_closed()
                break
            except TimeoutError:
                try:
                    await ws.send(json.dumps({"jsonrpc": "2.0", "id": n + 1, "method": "ping"}))
                except ConnectionClosed:
                    break
        tally.closed(ws)


async def _pipeline(url: str, token: str, tally: _Tally, limit: int) -> None:
    async with _stubborn(url) as ws:
        await _login(ws, "agent:pipe", token)
        tally.counts["connects"] += 1
        try:
            for n in range(limit):
                # send() waits while the socket is full: the bus's backpressure paces this loop.
                await ws.send(json.dumps({"jsonrpc": "2.0", "id": n + 1, "method": "ping"}))
                tally.counts["pings"] += 1
        except ConnectionClosed:
            tally.closed(ws)


def _garbage_frames() -> list[str]:
    """Text frames that are not requests, or that no strict parser accepts."""
    poison = '{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}'
    envelope = (
        '{"jsonrpc":"2.0","id":1,"method":"sendMessage","params":{"topic":"agent:soak-0000",'
        '"payload":{"messageId":"x","type":"agent_event","from":"agent:junk","timestamp":'
        '"2026-05-09T07:35:25Z","content":{"x":NaN}}}}'
    )
    return [
        "not json",
        poison,
        envelope,
        envelope.replace("NaN", "1e999"),
        '{"jsonrpc":"2.0","id":2,"method":"sendMessage","params":{"topic":"agent:*"}}',
        "[" * 3000 + "]" * 3000,
        '[{"jsonrpc":"2.0","id":3,"method":"nope"}, 1, "x"]',
    ]


_LAST_FRAMES: list[str | bytes] = [
    b'{"jsonrpc":"2.0","id":4,"method":"ping"}',  # binary: closed with 1003
    "x" * ((1 << 20) + 1),  # over max_frame_bytes: closed with 1009
]
"""What a logged-in garbage sender ends each connection with, in turn."""
GARBAGE_PER_CONNECTION = 30


async def _garbage(url: str, token: str, tally: _Tally, frames: Sequence[str], rate: float) -> None:
    """Send garbage until the bus closes the connection: anonymous, the tenth error (1008);
    logged in (every other connection), the binary or oversized frame at the end."""
    n = tally.counts["connects"]
    logged_in = n % 2 == 1
    last = _LAST_FRAMES[n // 2 % len(_LAST_FRAMES)]
    async with connect(url, compression=None, max_size=None) as ws:
        tally.counts["connects"] += 1
        if logged_in:
            await _login(ws, "agent:junk", token)

        async def read() -> None:
            with contextlib.suppress(ConnectionClosed):
                async for text in ws:
                    tally.answer(text)

        reader = asyncio.create_task(read())
        try:
            garbage = itertools.islice(itertools.cycle(frames), GARBAGE_PER_CONNECTION)
            for frame in itertools.chain(garbage, [last]):
                await ws.send(frame)
                tally.counts["frames"] += 1
                await asyncio.sleep(1 / rate)
            await ws.wait_closed()
        except ConnectionClosed:
            pass
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            tally.closed(ws)


async def _flood(url: str, token: str, tally: _Tally, size: int, rate: float) -> None:
    peer = Peer(url, "agent:flood", token, reconnect=True, request_timeout=90)
    content = {"text": "x" * size}
    window = asyncio.Semaphore(64)

    async def one() -> None:
        try:
            result = await peer.send("agent:stall", TYPE, content)
        except BusError as exc:
            tally.codes[f"error {exc.code}"] += 1
        except (TimeoutError, ConnectionError) as exc:
            tally.codes[type(exc).__name__] += 1
        else:
            tally.counts["delivered" if result.delivered_to else "not delivered"] += 1
        finally:
            window.release()

    await peer.connect()
    tasks: set[asyncio.Task[None]] = set()
    try:
        for _ in range(1_000_000):
            await window.acquire()
            tally.counts["sent"] += 1
            task = asyncio.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(1 / rate)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await peer.close()


async def misbehavers(params: dict[str, Any]) -> None:
    """On ``go``, run the four misbehaving peers for ``duration`` seconds, report ``done``."""
    url, tokens, duration = params["url"], params["tokens"], params["duration"]
    tallies = {name: _Tally() for name in ("stall", "pipe", "flood", "garbage")}
    frames = _garbage_frames()
    pings = 1_000_000
    emit("ready")
    commands = stdin_lines()
    await anext(commands)  # go
    sessions = {
        "stall": lambda t: _stall(url, tokens["agent:stall"], t),
        "pipe": lambda t: _pipeline(url, tokens["agent:pipe"], t, pings),
        "garbage": lambda t: _garbage(url, tokens["agent:junk"], t, frames, params["garbage_rate"]),
    }
    flood = _flood(
        url, tokens["agent:flood"], tallies["flood"], params["flood_bytes"], params["flood_rate"]
    )
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(duration), asyncio.TaskGroup() as group:
            for name, session in sessions.items():
                group.create_task(_reconnecting(tallies[name], session))
            group.create_task(flood)
    emit("done", **{name: tally.as_dict() for name, tally in tallies.items()})
    async for words in commands:
        if words[0] == "quit":
            break


# The orchestrator


def slope_mib_per_minute(samples: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of ``(seconds, MiB)`` samples, in MiB per minute; 0 if under two."""
    if len(samples) < 2:
        return 0.0
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_m = sum(m for _, m in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (m - mean_m) for t, m in samples)
    return cov / var * 60


def _memory(pid: int) -> tuple[float, float]:
    """Resident memory of ``pid`` in MiB: all of it (``VmRSS``), and its anonymous part
    (``RssAnon``: the heap, where a leak shows, without the files the process maps)."""
    anon = 0
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1]) * 1024
    return rss_bytes(pid) / MIB, anon / MIB


async def _sample(
    pid: int, every: float, until: float, out: list[tuple[float, float, float]]
) -> None:
    """Append ``(seconds since the start, RSS, anonymous RSS)`` of ``pid`` (MiB) every
    ``every`` seconds."""
    start = time.monotonic()
    for _ in range(int(until / every) + 2):
        out.append((time.monotonic() - start, *_memory(pid)))
        if time.monotonic() - start >= until:
            return
        await asyncio.sleep(every)


def _log_rows(db: Path) -> dict[str, int]:
    """The bus's log rows by event (with the status of refusals, limits and disconnects, and who
    was a slow consumer), after the run."""
    with contextlib.closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)) as conn:
        rows = conn.execute(
            "SELECT event, CASE WHEN event IN ('limit_exceeded', 'refused', 'rpc_error', "
            "'disconnect') THEN status WHEN event = 'slow_consumer' THEN actor END, COUNT(*) "
            "FROM activity_log GROUP BY 1, 2"
        ).fetchall()
    return {f"{event} {detail}" if detail else event: n for event, detail, n in rows}


async def _workers(
    url: str, tokens: Mapping[str, str], ids: list[str], options: Options, directory: Path
) -> list[Child]:
    size = options.per_process
    starts = []
    for index, first in enumerate(range(0, len(ids), size)):
        params = {
            "url": url,
            "peers": [[cid, tokens[cid]] for cid in ids[first : first + size]],
            "all": ids,
            "rate": options.rate,
            "duration": options.duration,
            "concurrency": options.concurrency,
            "seed": index,
        }
        starts.append(spawn_worker(f"soakers-{index}", "soakers", params, directory))
    return list(await asyncio.gather(*starts))


async def _one(directory: Path, options: Options) -> dict[str, Any]:
    ids = [f"agent:soak-{i:04d}" for i in range(options.peers)]
    tokens = make_peers(directory / "peers.yaml", {cid: [] for cid in (*ids, *MISBEHAVERS)})
    rss: list[tuple[float, float, float]] = []
    async with running_bus(directory, loop=options.loop) as bus:
        idle = rss_bytes(bus.pid) / MIB
        params = {
            "url": bus.url,
            "tokens": {cid: tokens[cid] for cid in MISBEHAVERS},
            "duration": options.duration,
            "flood_bytes": options.flood_bytes,
            "flood_rate": options.flood_rate,
            "garbage_rate": options.garbage_rate,
        }
        bad, workers = await asyncio.gather(
            spawn_worker("misbehavers", "misbehavers", params, directory),
            _workers(bus.url, tokens, ids, options, directory),
        )
        children = [bad, *workers]
        try:
            for worker in workers:
                await worker.send("connect")
            connected = [await w.expect("connected") for w in workers]
            cpu = cpu_seconds(bus.pid)
            for child in children:
                await child.send("go")
            sampler = asyncio.create_task(
                _sample(bus.pid, options.sample_every, options.duration, rss)
            )
            margin = 120.0  # a send in flight at the deadline is cancelled there
            reports = [await w.expect("done", options.duration + margin) for w in workers]
            misbehaved = await bad.expect("done", options.duration + margin)
            await sampler
            cpu = cpu_seconds(bus.pid) - cpu
        finally:
            for child in children:
                await child.stop()
    return _figures(options, idle, rss, cpu, connected, reports, misbehaved, directory)


def _figures(
    options: Options,
    idle: float,
    rss: list[tuple[float, float, float]],
    cpu: float,
    connected: list[dict[str, Any]],
    reports: list[dict[str, Any]],
    misbehaved: dict[str, Any],
    directory: Path,
) -> dict[str, Any]:
    stats: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    latencies: list[float] = []
    for r in reports:
        stats.update(r["stats"])
        errors.update(r["errors"])
        latencies.extend(r["latencies"])
    latencies.sort()
    second_half = [sample for sample in rss if sample[0] >= options.duration / 2]
    slope = slope_mib_per_minute([(t, m) for t, m, _ in second_half])
    return {
        "rss_idle_mib": idle,
        "rss_start_mib": rss[0][1],
        "rss_max_mib": max(m for _, m, _ in rss),
        "rss_end_mib": rss[-1][1],
        "slope_mib_per_min": slope,
        "anon_start_mib": rss[0][2],
        "anon_end_mib": rss[-1][2],
        "anon_slope_mib_per_min": slope_mib_per_minute([(t, a) for t, _, a in second_half]),
        "flat": slope < FLAT_MIB_PER_MINUTE,
        "bus_cpu_percent": cpu / options.duration * 100,
        "connect_failures": sum(c["failures"] for c in connected),
        "still_connected": sum(r["still_connected"] for r in reports),
        "sent": stats["sent"],
        "answered": stats["answered"],
        "delivered": stats["delivered"],
        "timeouts": stats["timeouts"],
        "disconnected": stats["disconnected"],
        "received": sum(r["received"] for r in reports),
        "p50_ms": latencies[len(latencies) // 2] * 1e3 if latencies else float("nan"),
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3 if latencies else float("nan"),
        "errors": dict(errors),
        "misbehaved": {k: v for k, v in misbehaved.items() if k != "event"},
        "log_rows": _log_rows(directory / "activity.db"),
        "rss_samples": rss,
    }


async def run(options: Options) -> dict[str, Any]:
    """Run scenario 7; return each repetition's figures and their summary."""
    samples: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        for rep in range(options.reps):
            directory = Path(tmp) / f"rep-{rep}"
            directory.mkdir()
            samples.append(await _one(directory, options))
            s = samples[-1]
            print(
                f"  rep {rep + 1}/{options.reps}: RSS {s['rss_start_mib']:.0f} -> "
                f"{s['rss_end_mib']:.0f} MiB (max {s['rss_max_mib']:.0f}), "
                f"{s['slope_mib_per_min']:+.2f} MiB/min over the second half",
                flush=True,
            )
    numeric = [k for k, v in samples[0].items() if isinstance(v, int | float)]
    summary = {key: summarize(float(s[key]) for s in samples) for key in numeric}
    return {"options": asdict(options), "samples": samples, "summary": summary}


def report(result: Mapping[str, Any]) -> str:
    """The results as Markdown tables: the figures, then the last repetition's details."""
    s = result["summary"]
    o = result["options"]
    last = result["samples"][-1]
    rows = [
        ["peers x seconds", f"{o['peers']:,} x {o['duration']:g} at {o['rate']:g} msg/s each"],
        ["bus RSS idle (MiB)", spread(s["rss_idle_mib"])],
        ["bus RSS at the start of the load (MiB)", spread(s["rss_start_mib"])],
        ["bus RSS max (MiB)", spread(s["rss_max_mib"])],
        ["bus RSS at the end (MiB)", spread(s["rss_end_mib"])],
        [
            f"RSS slope, second half (MiB/min; flat < {FLAT_MIB_PER_MINUTE:g})",
            spread(s["slope_mib_per_min"], lambda v: f"{v:+.2f}"),
        ],
        ["memory flat", "yes" if all(x["flat"] for x in result["samples"]) else "NO"],
        ["anonymous RSS (heap) start / end (MiB)", f"{last['anon_start_mib']:.1f} / "
         f"{last['anon_end_mib']:.1f}"],
        ["anonymous RSS slope, second half (MiB/min)", spread(s["anon_slope_mib_per_min"],
         lambda v: f"{v:+.2f}")],
        ["bus CPU (% of one core)", spread(s["bus_cpu_percent"])],
        ["failed connects / peers connected at the end", f"{last['connect_failures']} / "
         f"{last['still_connected']:,}"],
        ["messages sent", spread(s["sent"])],
        ["answered", spread(s["answered"])],
        ["delivered (deliveredTo >= 1)", spread(s["delivered"])],
        ["received by the peers", spread(s["received"])],
        ["timeouts / disconnected", f"{last['timeouts']} / {last['disconnected']}"],
        ["sendMessage p50 / p99 (ms)", f"{last['p50_ms']:.1f} / {last['p99_ms']:.1f}"],
        ["errors by code", _counts(last["errors"]) or "none"],
    ]  # fmt: skip
    misbehaved = [[name, _counts(tally)] for name, tally in last["misbehaved"].items()]
    logged = sorted(last["log_rows"].items(), key=lambda kv: -kv[1])
    return "\n\n".join(
        [
            table(["figure", "median (min-max)"], rows),
            table(["misbehaving peer", "what it did and saw (last rep)"], misbehaved),
            table(["bus log rows (last rep)", "count"], logged),
        ]
    )


def _counts(counts: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}: {value:,}" for key, value in sorted(counts.items()))
