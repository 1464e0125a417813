"""What every scenario shares: child processes, /proc readings, statistics, machine info, tables.

A scenario is an orchestrator (this process) and children on 127.0.0.1: a server (the bus, run
as ``python -m peers serve``, or the baseline relay) and worker processes (``python -m bench
worker ROLE PARAMS_FILE``) that play the peers. Children talk to the orchestrator in JSON lines: a
worker prints one object per line on stdout and reads one command per line on stdin. CPU time and
memory of a child come from ``/proc/<pid>``, so nothing in the measured process has to cooperate.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import platform
import resource
import signal
import sqlite3
import statistics
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bus.ops.credentials import Credentials

__all__ = [
    "Child",
    "Server",
    "cpu_seconds",
    "emit",
    "machine",
    "machine_line",
    "make_peers",
    "percentile",
    "raise_fd_limit",
    "rss_bytes",
    "running_bus",
    "running_relay",
    "spawn",
    "spawn_worker",
    "spread",
    "stdin_lines",
    "summarize",
    "table",
]

_CLK_TCK = os.sysconf("SC_CLK_TCK")
# Seconds the orchestrator waits for any one answer from a child before it gives up.
CHILD_TIMEOUT = 600.0
START_TIMEOUT = 60.0

# /proc readings


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of process ``pid``, all its threads (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        # The command name may hold spaces or parentheses: split after its closing one.
        fields = f.read().rsplit(")", 1)[1].split()
    # Fields 14 and 15 of proc(5); fields[0] here is field 3 (state).
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` in bytes (``VmRSS`` in ``/proc/<pid>/status``)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def raise_fd_limit() -> int:
    """Raise this process's open-file limit to its hard limit (children inherit it); return it."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


# Statistics


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` by nearest rank; ``values`` need no order."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summarize(values: Iterable[float]) -> dict[str, float]:
    """Median, min and max of the repetitions of one figure."""
    data = list(values)
    if not data:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": statistics.median(data), "min": min(data), "max": max(data)}


# Machine


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """Cores, CPU, OS, Python and the versions of the libraries on the measured path."""
    return {
        "cores": len(os.sched_getaffinity(0)),
        "cpu": _cpu_model(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "libraries": {
            name: _version(name)
            for name in ("bcpbus", "websockets", "pydantic", "pydantic-core", "orjson")
        }
        | {"orjson": _version("orjson"), "uvloop": _version("uvloop")}
        | {"sqlite": sqlite3.sqlite_version},
    }


def machine_line(info: Mapping[str, Any]) -> str:
    """One line for a table caption: ``2 cores (CPU), Linux x, Python 3.11.7, websockets 17...``"""
    libraries = ", ".join(f"{k} {v}" for k, v in info["libraries"].items() if v != "-")
    return (
        f"{info['cores']} cores ({info['cpu']}), {info['os']}, Python {info['python']}, "
        f"{libraries}; load average {info['loadavg'][0]:.2f} at start"
    )


# Tables


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table, columns padded so it also reads well in a terminal."""
    cells = [[str(h) for h in headers], *([_cell(v) for v in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    out = []
    for index, row in enumerate(cells):
        out.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
        if index == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def spread(figure: Mapping[str, float], fmt: Callable[[float], str] | None = None) -> str:
    """``median (min-max)`` of one summarized figure."""
    show = fmt or _cell
    return f"{show(figure['median'])} ({show(figure['min'])}-{show(figure['max'])})"


# Credentials


def make_peers(path: Path, peers: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Write a peers file for ``{clientId: roles}``; return ``{clientId: token}``."""
    credentials = Credentials.empty()
    tokens = {client_id: credentials.add(client_id, roles) for client_id, roles in peers.items()}
    credentials.save(path)
    return tokens


# Children


@dataclass
class Child:
    """A child process that answers in JSON lines on stdout and reads commands on stdin."""

    name: str
    process: asyncio.subprocess.Process
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    async def read(self, seconds: float = CHILD_TIMEOUT) -> dict[str, Any]:
        """The next JSON object the child prints.

        Raises:
            RuntimeError: the child exited first; the message holds the end of its stderr.
        """
        assert self.process.stdout is not None
        async with asyncio.timeout(seconds):
            line = await self.process.stdout.readline()
        if not line:
            await self.process.wait()
            raise RuntimeError(f"{self.name} exited ({self.process.returncode}):\n{self.tail()}")
        message: dict[str, Any] = json.loads(line)
        return message

    async def expect(self, event: str, seconds: float = CHILD_TIMEOUT) -> dict[str, Any]:
        """Read messages until one whose ``event`` is ``event``; return it."""
        while True:
            message = await self.read(seconds)
            if message.get("event") == event:
                return message

    async def send(self, *words: object) -> None:
        """Write one command line (space-separated words) to the child's stdin."""
        assert self.process.stdin is not None
        self.process.stdin.write((" ".join(str(w) for w in words) + "\n").encode())
        await self.process.stdin.drain()

    async def stop(self, *, terminate: bool = False, seconds: float = 60.0) -> int:
        """Ask the child to end (``quit`` on stdin, or SIGTERM) and wait; kill it if it lingers."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, ConnectionError):
                if terminate:
                    self.process.send_signal(signal.SIGTERM)
                else:
                    await self.send("quit")
        try:
            async with asyncio.timeout(seconds):
                return await self.process.wait()
        except TimeoutError:
            self.process.kill()
            return await self.process.wait()

    def tail(self, lines: int = 20) -> str:
        """The last lines of the child's stderr, for error messages."""
        with contextlib.suppress(OSError):
            return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


async def spawn(name: str, argv: Sequence[str], directory: Path) -> Child:
    """Start ``argv`` with piped stdin/stdout and stderr to ``directory/<name>.err``."""
    stderr_path = directory / f"{name}.err"
    stderr = stderr_path.open("wb")  # the child holds its own copy once started
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            cwd=directory,
            env=_child_env(),
            limit=1 << 24,
        )
    finally:
        stderr.close()
    return Child(name, process, stderr_path)


def _worker_argv(name: str, role: str, params: Mapping[str, Any], directory: Path) -> list[str]:
    # Parameters go in a file: 2,500 peers' tokens are more than one argument may hold.
    path = directory / f"{name}.params.json"
    path.write_text(json.dumps(params))
    return [sys.executable, "-m", "bench", "worker", role, str(path)]


def _child_env() -> dict[str, str]:
    # Children run in a scratch directory; let them import bench (and an uninstalled checkout).
    root = str(Path(__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}"}


async def spawn_worker(name: str, role: str, params: Mapping[str, Any], directory: Path) -> Child:
    """Start ``python -m bench worker ROLE PARAMS_FILE`` and wait for its ``ready`` line."""
    child = await spawn(name, _worker_argv(name, role, params, directory), directory)
    await child.expect("ready", START_TIMEOUT)
    return child


@dataclass
class Server:
    """A server child (the bus or the relay) and the URL it listens on."""

    child: Child
    url: str
    http_url: str | None = None
    """The bus's HTTP binding, when it was started with one."""

    @property
    def pid(self) -> int:
        return self.child.pid


async def _listening(child: Child) -> str:
    assert child.process.stdout is not None
    async with asyncio.timeout(START_TIMEOUT):
        line = (await child.process.stdout.readline()).decode().strip()
    if not line.startswith("listening on "):
        await child.stop(terminate=True)
        raise RuntimeError(f"{child.name} did not start: {line!r}\n{child.tail()}")
    return line.removeprefix("listening on ")


@contextlib.asynccontextmanager
async def running_bus(
    directory: Path,
    *,
    gateway: bool = False,
    policy: Path | None = None,
    agents_dir: Path | None = None,
    loop: str = "asyncio",
    http: bool = False,
    transport: str = "websockets",
) -> AsyncIterator[Server]:
    """Run ``bcpbus serve`` on 127.0.0.1 port 0 with its log and peers file in ``directory``;
    ``http`` adds the HTTP binding on a free port (``Server.http_url``); ``transport`` is its
    ``--transport``.

    The peers file is ``directory/peers.yaml``: write it with :func:`make_peers` first. The bus
    runs with its default limits and audit log; SIGTERM at the end flushes the log.
    """
    argv = [
        sys.executable,
        "-m",
        "peers",  # the whole bcpbus command: the bus, and the gateway unless --no-gateway
        "serve",
        # Always the loop asked for: serve alone would pick uvloop whenever it is installed,
        # and the relay it is compared with runs on the loop asked for.
        "--loop",
        loop,
        "--port",
        "0",
        "--db",
        str(directory / "activity.db"),
        "--peers-file",
        str(directory / "peers.yaml"),
        "--agents-dir",
        str(agents_dir or _empty_dir(directory)),
    ]
    if policy is not None:
        argv += ["--policy", str(policy)]
    if not gateway:
        argv.append("--no-gateway")
    if http:
        argv += ["--http-port", "0"]
    if transport != "websockets":  # the default: left out, for trees without the option
        argv += ["--transport", transport]
    child = await spawn("bus", argv, directory)
    try:
        url = await _listening(child)
        http_url = None
        if http:
            assert child.process.stdout is not None
            async with asyncio.timeout(START_TIMEOUT):
                line = (await child.process.stdout.readline()).decode().strip()
            http_url = line.removeprefix("http on ")
        yield Server(child, url, http_url)
    finally:
        code = await child.stop(terminate=True)
        if code not in (0, -signal.SIGTERM):
            print(f"warning: the bus exited with {code}:\n{child.tail()}", file=sys.stderr)


@contextlib.asynccontextmanager
async def running_relay(directory: Path, *, loop: str = "asyncio") -> AsyncIterator[Server]:
    """Run the baseline relay (:mod:`bench.relay`) on 127.0.0.1 port 0."""
    argv = _worker_argv("relay", "relay", {"loop": loop}, directory)
    child = await spawn("relay", argv, directory)
    try:
        url = await _listening(child)
        yield Server(child, url)
    finally:
        await child.stop(terminate=True)


def _empty_dir(directory: Path) -> Path:
    # No agent definitions: the bus must not pick up ./agents from wherever it runs.
    empty = directory / "no-agents"
    empty.mkdir(exist_ok=True)
    return empty


# The worker side


def emit(event: str, **fields: Any) -> None:
    """Print one JSON line for the orchestrator (a worker's only way to report)."""
    print(json.dumps({"event": event, **fields}), flush=True)


async def stdin_lines() -> AsyncIterator[list[str]]:
    """Yield the orchestrator's commands, one list of words per line, until stdin closes."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        words = line.decode().split()
        if words:
            yield words
