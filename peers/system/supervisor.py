"""Agent processes the system peer started: start, watch, report, stop.

Each child runs in a session of its own (its own process group), so a Ctrl-C at the terminal
reaches the system peer, which then stops the children in order, and stopping a child stops
whatever it started. Its standard input is a pipe the supervisor holds: when the supervisor's
process ends, however it ends, the child reads end of input and should exit (the echo agent
does), so no agent outlives the peer that answers for it. Its standard output and error are
read line by line and handed to ``on_output``; its exit to ``on_exit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Child", "Supervisor"]

_LINE_LIMIT = 1 << 20  # longer output lines are passed on in pieces of this size


@dataclass
class Child:
    """One running agent process."""

    name: str
    process: asyncio.subprocess.Process
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.process.pid


class Supervisor:
    """Starts agent processes by name, at most one per name, and stops them all on close.

    Args:
        on_output: called with the agent's name and each line it writes (stdout and stderr).
        on_exit: called with the child and its exit status when it ends (negative: the
            signal that killed it), after its last line.
        stop_timeout: seconds a child has to exit after SIGTERM before it gets SIGKILL.
    """

    def __init__(
        self,
        *,
        on_output: Callable[[str, str], None],
        on_exit: Callable[[Child, int], None],
        stop_timeout: float = 5.0,
    ) -> None:
        self.on_output = on_output
        self.on_exit = on_exit
        self.stop_timeout = stop_timeout
        self._children: dict[str, Child] = {}
        self._watchers: set[asyncio.Task[None]] = set()

    def running(self, name: str) -> Child | None:
        """The child running as ``name``, or None."""
        return self._children.get(name)

    async def start(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | os.PathLike[str]
    ) -> Child:
        """Start ``argv`` as ``name``.

        Raises:
            OSError: the program cannot be started (not found, not executable, bad ``cwd``).
            RuntimeError: ``name`` is already running.
        """
        if name in self._children:
            raise RuntimeError(f"{name} is already running")
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=dict(env),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            limit=_LINE_LIMIT,
        )
        child = Child(name, process)
        self._children[name] = child
        watcher = asyncio.create_task(self._watch(child))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        return child

    async def _watch(self, child: Child) -> None:
        stream = child.process.stdout
        assert stream is not None
        while True:
            try:
                line = await stream.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:  # the end: a last line with no newline
                line = exc.partial
            except asyncio.LimitOverrunError as exc:  # a line over the limit: pass on a piece
                line = await stream.read(exc.consumed)
            if not line:
                break
            self.on_output(child.name, line.decode("utf-8", "replace").rstrip("\r\n"))
        code = await child.process.wait()
        if self._children.get(child.name) is child:
            del self._children[child.name]
        self.on_exit(child, code)

    async def close(self) -> None:
        """Stop every child: end its input, SIGTERM its process group, SIGKILL it after
        ``stop_timeout``; wait until each exit is reported. Idempotent."""
        children = list(self._children.values())
        for child in children:
            _end_input(child)
            _signal_group(child, signal.SIGTERM)
        if self._watchers:
            _, late = await asyncio.wait(set(self._watchers), timeout=self.stop_timeout)
            if late:
                for child in list(self._children.values()):
                    _signal_group(child, signal.SIGKILL)
                # A process that left the group may still hold the output pipe open: stop
                # reading it rather than wait forever.
                _, stuck = await asyncio.wait(late, timeout=self.stop_timeout)
                for watcher in stuck:
                    watcher.cancel()
                await asyncio.gather(*stuck, return_exceptions=True)


def _end_input(child: Child) -> None:
    stdin = child.process.stdin
    if stdin is not None:
        with contextlib.suppress(OSError):
            stdin.close()


def _signal_group(child: Child, sig: signal.Signals) -> None:
    # The child leads its own process group (start_new_session), so its pid names the group.
    # Until the watcher has reaped it, the pid cannot have been reused.
    if child.process.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, sig)
