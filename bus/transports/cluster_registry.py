"""One link per clientId in the cluster: logins registered in NATS's key-value store."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .cluster_node import Accepted, Node
from .cluster_wire import presence_key

if TYPE_CHECKING:
    from nats.js.kv import KeyValue

__all__ = ["Registry"]


class Registry:
    """One link per clientId in the cluster, kept in the key-value bucket
    :data:`PRESENCE_BUCKET`: each login registers at once, and the later registration (the
    higher revision) wins: the node holding the older link closes it with 4001."""

    def __init__(self, bus: Node, node: str, kv: KeyValue, spawn: Callable[[Any], object]) -> None:
        self.bus, self.node, self._kv, self._spawn = bus, node, kv, spawn
        self._mine: dict[str, int] = {}
        """clientId -> the revision of its link's registration on this node."""
        self._elsewhere: dict[str, tuple[int, str]] = {}
        """clientId -> the revision and node of its latest registration on another node: one
        seen before this node's own put was acknowledged may be the later of the two."""

    def joined(self, client_id: str) -> None:
        """Register ``client_id``'s new link here: a login on another node before this one is
        then closed, and one after it closes this one."""
        self._mine.pop(client_id, None)
        self._spawn(self._register(client_id))

    async def left(self, message: Accepted) -> None:
        """Drop the registration of a peer that left (and has not come back meanwhile)."""
        client_id = message.payload.get("content", {}).get("clientId")
        if message.type != "peer_left" or client_id in self.bus.peers:
            return
        revision = self._mine.pop(client_id, None) if isinstance(client_id, str) else None
        if revision is not None:
            await self._unregister(client_id, revision)

    async def leave_all(self) -> None:
        """Drop every registration of this node (it is closing)."""
        for client_id, revision in list(self._mine.items()):
            await self._unregister(client_id, revision)

    async def _register(self, client_id: str) -> None:
        value = json.dumps({"node": self.node, "clientId": client_id}).encode()
        try:
            revision = await self._kv.put(presence_key(client_id), value)
        except Exception:  # cut off meanwhile: heal() registers it again
            return
        self._mine[client_id] = revision
        later, node = self._elsewhere.get(client_id, (0, ""))
        if later > revision:  # the other login's entry came in before this put's answer
            self._seen_elsewhere(client_id, node, later)

    async def _unregister(self, client_id: str, revision: int) -> None:
        with contextlib.suppress(Exception):  # someone registered since: theirs stays
            await self._kv.delete(presence_key(client_id), last=revision)

    async def watch(self) -> None:
        """Close the link of a peer here when a later registration puts it on another node."""
        watcher = await self._kv.watchall()
        async for entry in watcher:
            if entry is None or entry.value is None or entry.operation is not None:
                continue  # the end of the initial values, or a deletion
            with contextlib.suppress(ValueError, KeyError, TypeError):
                record = json.loads(entry.value)
                self._seen_elsewhere(record["clientId"], record["node"], entry.revision)

    def _seen_elsewhere(self, client_id: str, node: str, revision: int) -> None:
        if node == self.node:
            return
        self._elsewhere[client_id] = max(self._elsewhere.get(client_id, (0, "")), (revision, node))
        if client_id not in self.bus.peers:
            return
        mine = self._mine.get(client_id)
        if mine is None or mine > revision:
            return  # not registered here yet (ours will be later), or ours is the newer
        self._mine.pop(client_id, None)
        self.bus.replaced_elsewhere(client_id, node)

    async def heal(self) -> None:
        """After NATS comes back: register again the peers still here, unless a later
        registration put them on another node meanwhile (then this link is the older)."""
        for client_id in list(self.bus.peers):
            try:
                entry = await self._kv.get(presence_key(client_id))
                record = json.loads(entry.value or b"{}")
            except Exception:
                record = {}
            if record.get("node") not in (None, self.node):
                self._mine.pop(client_id, None)
                self.bus.replaced_elsewhere(client_id, record["node"])
            else:
                await self._register(client_id)
