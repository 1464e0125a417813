"""The nodes of the cluster to each other: who is alive, and reloads asked of all.

Each node says hello on NATS every :data:`HEARTBEAT` seconds: a sender waits for the answers of
the nodes alive when it sends, and stops waiting for one that goes silent for :data:`NODE_TTL`
(killed) or says ``bye`` (closed). A node reloaded on SIGHUP asks the others to reload on
:data:`RELOAD_SUBJECT` (:class:`Reloads`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from pydantic import ValidationError

from ..core.logevents import LogEvent
from ..log.activity import ActivityLog
from .cluster_node import Trigger
from .cluster_wire import HEARTBEAT, HELLO_SUBJECT, NODE_TTL, RELOAD_SUBJECT, Hello, Reload, encode

if TYPE_CHECKING:
    from nats.aio.msg import Msg

__all__ = ["Nodes", "Reloads"]

logger = logging.getLogger("bus.transports.cluster")


class Nodes:
    """The other nodes of the cluster as one node hears them.

    Args:
        log: this node's activity log (``cluster_node`` rows: joined, left).
        node: this node's name, in its hellos.
        publish: sends a body on a subject (the link's NATS connection).
    """

    def __init__(
        self, log: ActivityLog, node: str, publish: Callable[[str, bytes], Awaitable[None]]
    ) -> None:
        self.log = log
        self.node = node
        self._publish = publish
        self._seen: dict[str, float] = {}
        """Node -> when it was last heard from (monotonic seconds)."""
        self._joined = asyncio.Event()

    def live(self) -> set[str]:
        """The other nodes heard from in the last :data:`NODE_TTL` seconds."""
        now = time.monotonic()
        return {node for node, seen in self._seen.items() if now - seen < NODE_TTL}

    async def wait_for(self, node: str) -> None:
        """Return once ``node`` is alive in this node's view; wrap it in a timeout."""
        while node not in self.live():
            self._joined.clear()
            await self._joined.wait()

    async def hello(self) -> None:
        """Say this node is alive."""
        await self._publish(HELLO_SUBJECT, encode(Hello(node=self.node)))

    async def heartbeat(self, connected: Callable[[], bool]) -> None:
        """Say hello every :data:`HEARTBEAT` seconds while ``connected()``; run it as a task."""
        while True:
            await asyncio.sleep(HEARTBEAT)
            if connected():
                with contextlib.suppress(Exception):
                    await self.hello()

    async def on_hello(self, msg: Msg) -> None:
        """Note another node's hello or bye (the NATS callback of :data:`HELLO_SUBJECT`)."""
        try:
            hello = Hello.model_validate_json(msg.data)
        except ValidationError:
            return
        if hello.bye:
            self._seen.pop(hello.node, None)
            self.log.record(LogEvent.CLUSTER_NODE, actor=hello.node, status="left")
            return
        if hello.node not in self._seen:
            self.log.record(LogEvent.CLUSTER_NODE, actor=hello.node, status="joined")
            logger.info("node %s is in the cluster", hello.node)
            await self.hello()  # so that it knows this node at once too
        self._seen[hello.node] = time.monotonic()
        self._joined.set()


class Reloads:
    """Reloads asked of every node: a SIGHUP on one node reloads them all.

    Args:
        log: this node's activity log (``cluster_node`` row, status ``reload``).
        node: this node's name, in its requests.
        publish: sends a body on a subject (the link's NATS connection).
    """

    def __init__(
        self, log: ActivityLog, node: str, publish: Callable[[str, bytes], Awaitable[None]]
    ) -> None:
        self.log = log
        self.node = node
        self._publish = publish
        self.reloader: Trigger | None = None
        """What reloads this node (:class:`bus.ops.reload.Reloader`); None: it follows none."""

    async def ask_others(self) -> None:
        """Ask every other node to read its files again."""
        await self._publish(RELOAD_SUBJECT, encode(Reload(node=self.node)))

    async def on_reload(self, msg: Msg) -> None:
        """Reload this node when another one asks (the NATS callback of :data:`RELOAD_SUBJECT`)."""
        try:
            reload = Reload.model_validate_json(msg.data)
        except ValidationError:
            return
        if reload.node != self.node and self.reloader is not None:
            logger.info("node %s asked for a reload", reload.node)
            self.log.record(LogEvent.CLUSTER_NODE, actor=reload.node, status="reload")
            self.reloader.trigger()
