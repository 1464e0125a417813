"""Changes without restarts: the peers file, the policy and the agent definitions, read again
on SIGHUP and when they change on disk.

A :class:`Reloader` owns a list of parts (:class:`Reloadable`): the bus's own files
(:class:`BusFiles`) and whatever runs beside it (the gateway's channels). Once a second it
compares the files' modification stamps (one ``stat`` per file, a few microseconds); on a
change, or at once on :meth:`Reloader.trigger` (SIGHUP), it reloads:

1. every part reads and checks its files and returns how to apply them (:meth:`Reloadable.prepare`);
2. if any part fails, nothing changes: the running configuration stays in force, and the
   reason is one line on stderr and a ``reload`` row with status ``failed``;
3. otherwise every part applies its change, one after the other with no ``await`` between, so
   no request is ever handled under half of a reload; a ``reload`` row with status ``ok``.

Applying the bus's part closes the peers whose token was removed or rotated, or whose roles
the policy no longer admits (close code 4005), and drops the subscriptions a peer's new rights
no longer allow (:mod:`bus.ops.rights`). A file written in two steps may be seen half-written: the
reload fails, says so, and the next change (the second step) reloads again.

::

    reloader = Reloader(bus.log, say=print)
    reloader.add(BusFiles(bus, peers_file=..., policy=..., agents_dir=...))
    loop.add_signal_handler(signal.SIGHUP, reloader.trigger)
    async with reloader:        # polls until the block ends
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from schemas.common import BUS_CLIENT_ID

from ..core.errors import BusError
from ..core.identities import load_identities
from ..core.logevents import LogEvent
from ..core.policy import Policy
from ..log.activity import ActivityLog
from .credentials import Credentials

if TYPE_CHECKING:
    from ..server import Bus

__all__ = ["DEFAULT_RELOAD_INTERVAL", "BusFiles", "Reloadable", "Reloader", "stamp"]

logger = logging.getLogger("bus.ops.reload")

DEFAULT_RELOAD_INTERVAL = 1.0
"""Seconds between two looks at the files' modification stamps."""

Stamp = tuple[tuple[str, int, int, int], ...]


class Reloadable(Protocol):
    """One part of a running process whose configuration comes from files."""

    name: str
    """What the part is, in the line a reload prints (``bus``, ``gateway``)."""

    def watched(self) -> Iterable[Path]:
        """The files and directories whose changes call for a reload."""
        ...

    def prepare(self) -> Callable[[], str]:
        """Read and check the files; return the function that puts them in force.

        The returned function must not fail or await; it returns a few words on what changed.

        Raises:
            Exception: the files are invalid; the message names the file and says why.
        """
        ...


def stamp(paths: Iterable[Path]) -> Stamp:
    """The modification stamps of ``paths``, and of the files directly in those that are
    directories: name, size, mtime and inode each (a missing file counts too)."""
    entries: list[tuple[str, int, int, int]] = []
    for path in paths:
        entries.append(_stat(path))
        if path.is_dir():
            with contextlib.suppress(OSError):
                entries.extend(_stat(child) for child in sorted(path.iterdir()))
    return tuple(entries)


def _stat(path: Path) -> tuple[str, int, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (str(path), -1, -1, -1)
    return (str(path), st.st_size, st.st_mtime_ns, st.st_ino)


class Reloader:
    """Reload its parts together, on :meth:`trigger` and when their files change.

    Args:
        log: the activity log that gets a ``reload`` row per attempt.
        say: prints the one line each reload ends with (``bcpbus serve``: stderr).
        interval: seconds between looks at the files; None only reloads on :meth:`trigger`.
    """

    def __init__(
        self,
        log: ActivityLog,
        *,
        say: Callable[[str], None] = print,
        interval: float | None = DEFAULT_RELOAD_INTERVAL,
    ) -> None:
        self.log = log
        self.say = say
        self.interval = interval
        self.parts: list[Reloadable] = []
        self.polls: list[Callable[[], object]] = []
        """Called at every look and every trigger (the gateway's budget resets)."""
        self._stamp: Stamp = ()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.reloads = 0
        """Reloads attempted so far, failed ones included."""
        self.reloaded = asyncio.Event()
        """Set after each reload attempt; tests clear it and wait."""

    def add(self, part: Reloadable) -> None:
        """Reload ``part`` with the others from now on."""
        self.parts.append(part)
        self._stamp = self._current()

    def trigger(self) -> None:
        """Reload now (SIGHUP), whether or not the files changed."""
        self._wake.set()

    async def __aenter__(self) -> Reloader:
        self._stamp = self._current()
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._wake.wait()
            forced = self._wake.is_set()
            self._wake.clear()
            for poll in self.polls:
                outcome = poll()
                if asyncio.iscoroutine(outcome):
                    await outcome
            current = self._current()
            if forced or current != self._stamp:
                self._stamp = current
                self.reload()
                with contextlib.suppress(BusError):  # a failed log says so on its own
                    await self.log.commit()

    def _current(self) -> Stamp:
        return stamp(path for part in self.parts for path in part.watched())

    def reload(self) -> bool:
        """Reload every part now, all or nothing; return whether the new files are in force."""
        self.reloads += 1
        try:
            try:
                steps = [(part.name, part.prepare()) for part in self.parts]
            except Exception as exc:  # any part's refusal keeps everything as it runs
                reason = _one_line(exc)
                self.log.record(LogEvent.RELOAD, actor=BUS_CLIENT_ID, status="failed", error=reason)
                logger.info("reload failed: %s", reason)  # say() prints it: one line, not two
                self.say(f"bcpbus: reload failed, the running configuration stays: {reason}")
                return False
            done = [f"{name}: {apply()}" for name, apply in steps]
            summary = "; ".join(done)
            self.log.record(
                LogEvent.RELOAD, actor=BUS_CLIENT_ID, status="ok", payload={"summary": summary}
            )
            logger.info("reloaded: %s", summary)
            self.say(f"bcpbus: reloaded ({summary})")
            return True
        finally:
            self.reloaded.set()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:500]


class BusFiles:
    """The bus's part of a reload: its peers file, its policy and the agent definitions.

    The gateway's in-memory credential (``bcpbus serve`` makes one per run) is kept.
    """

    name = "bus"

    def __init__(
        self,
        bus: Bus,
        *,
        peers_file: Path,
        policy: Path | None,
        agents_dir: Path | None,
    ) -> None:
        self.bus = bus
        self.peers_file = peers_file
        self.policy = policy
        self.agents_dir = agents_dir

    def watched(self) -> list[Path]:
        paths = [self.peers_file]
        paths += [p for p in (self.policy, self.agents_dir) if p is not None]
        return paths

    def prepare(self) -> Callable[[], str]:
        credentials = self.bus.credentials.reloaded(self.peers_file)
        policy = Policy.load(self.policy) if self.policy is not None else Policy.default()
        identities = load_identities(self.agents_dir) if self.agents_dir is not None else {}

        def apply() -> str:
            revoked, dropped = self.bus.reconfigure(
                credentials=credentials, policy=policy, identities=identities
            )
            return (
                f"{_count(credentials, 'peer')}, {len(policy.roles)} roles, "
                f"{len(identities)} agents; {revoked} connections revoked, "
                f"{dropped} subscriptions dropped"
            )

        return apply


def _count(credentials: Credentials, noun: str) -> str:
    return f"{len(credentials)} {noun}{'' if len(credentials) == 1 else 's'}"
