"""Agent processes under the supervisor: output passed on, exits reported, all stopped on close."""

from __future__ import annotations

import asyncio
import os
import sys

from peers.system.supervisor import Child, Supervisor
from peers.testing import scaled

STUBBORN = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
sys.stdout.write("x" * 1_500_000 + "\\n")
print("up", flush=True)
time.sleep(60)
"""


async def test_output_and_exit_are_reported_and_a_stubborn_child_is_killed(tmp_path):
    """Lines (a long one in pieces) reach on_output; SIGTERM ignored means SIGKILL at close."""
    lines: list[tuple[str, str]] = []
    exits: list[tuple[str, int]] = []
    up = asyncio.Event()

    def output(name: str, line: str) -> None:
        lines.append((name, line))
        if line == "up":
            up.set()

    def exited(child: Child, code: int) -> None:
        exits.append((child.name, code))

    supervisor = Supervisor(on_output=output, on_exit=exited, stop_timeout=scaled(0.5))
    child = await supervisor.start(
        "stubborn", [sys.executable, "-c", STUBBORN], env=os.environ, cwd=tmp_path
    )
    async with asyncio.timeout(scaled(20)):
        await up.wait()
    assert supervisor.running("stubborn") is child
    await supervisor.close()
    assert exits == [("stubborn", -9)]
    assert supervisor.running("stubborn") is None
    assert sum(len(line) for name, line in lines if name == "stubborn") >= 1_500_002


async def test_a_child_that_exits_is_forgotten_and_may_start_again(tmp_path):
    """An exit is reported with its status; the name is free for a new process."""
    exits: asyncio.Queue[int] = asyncio.Queue()
    supervisor = Supervisor(
        on_output=lambda *_: None, on_exit=lambda _, code: exits.put_nowait(code)
    )
    quick = [sys.executable, "-c", "raise SystemExit(3)"]
    await supervisor.start("quick", quick, env=os.environ, cwd=tmp_path)
    async with asyncio.timeout(scaled(20)):
        assert await exits.get() == 3
    assert supervisor.running("quick") is None
    await supervisor.start("quick", quick, env=os.environ, cwd=tmp_path)
    async with asyncio.timeout(scaled(20)):
        assert await exits.get() == 3
    await supervisor.close()
