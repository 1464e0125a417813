"""Reloads across bus nodes: a SIGHUP on one node makes every node read its files again."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from bus.ops.credentials import Credentials
from peers import Peer
from peers.client import Disconnected
from peers.testing import Inbox, scaled
from tests.cluster.test_cluster import joined, peer, rows


def rotate_unseen(path: Path, client_id: str) -> str:
    """Give ``client_id`` a new token in the peers file at ``path`` without changing what a
    node polling the file sees (same inode, size and modification time); return the token."""
    before = os.stat(path)
    credentials = Credentials.load(path)
    credentials.remove(client_id)
    token = credentials.add(client_id, [])
    scratch = path.with_name("rotated.yaml")
    credentials.save(scratch)
    text = scratch.read_bytes()
    assert len(text) == before.st_size  # the same size: only a SIGHUP can reveal the change
    with path.open("r+b") as file:  # in place: the same inode
        file.write(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    return token


async def test_a_sighup_on_one_node_reloads_every_node(cluster):
    """After a token is rotated in the shared peers file unseen by the nodes' polling, a SIGHUP
    to node a alone closes the old token's link on node b (4005) and logs b's reload."""
    tokens = {cid: cluster.token(cid) for cid in ("w:1", "watch:a")}
    a, b = await cluster.node("a"), await cluster.node("b")
    watch = Inbox(reply=True)
    closed: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

    def on_connection(event: object) -> None:
        if isinstance(event, Disconnected) and not closed.done():
            closed.set_result(event.closed.code)

    async with peer(a, "watch:a", tokens["watch:a"], watch, "system:presence"):
        rotated = Peer(b.url, "w:1", tokens["w:1"], reconnect=False, on_connection=on_connection)
        async with rotated:
            await joined(watch, "w:1")  # b's presence reached a: so did b's hello
            rotate_unseen(cluster.root / "bcpbus-peers.yaml", "w:1")
            a.process.send_signal(signal.SIGHUP)
            async with asyncio.timeout(scaled(10)):
                code = await closed
    assert code == 4005
    await cluster.close()
    for node in (a, b):
        assert [row["status"] for row in rows(node.db, "reload")] == ["ok"]
    assert [r["actor"] for r in rows(b.db, "cluster_node") if r["status"] == "reload"] == ["a"]
