"""One cursor for the cluster: a message has the same epoch on every node, so a peer that read
on one node resumes on another with no gap and no duplicate (real nodes, real nats-server)."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import sqlite3
from pathlib import Path

from peers import Peer
from peers.messages import Message
from peers.testing import Inbox, scaled
from tests.cli.test_operators import arun
from tests.cluster.conftest import Cluster, Node
from tests.cluster.test_cluster import joined, peer

SENDERS = ("w:0", "w:1", "w:2")
PER_SENDER = 30


async def send_all(cluster: Cluster, nodes: list[Node], tokens: dict[str, str]) -> list[str]:
    """Each sender, one per node, sends PER_SENDER notes to room:x, all at once; return the
    messageIds of every note sent."""

    async def one(node: Node, client_id: str) -> list[str]:
        async with peer(node, client_id, tokens[client_id], Inbox()) as sender:
            return [
                (await sender.send("room:x", "note", {"n": n, "by": client_id})).message_id
                for n in range(PER_SENDER)
            ]

    sent = await asyncio.gather(
        *(one(node, cid) for node, cid in zip(nodes, SENDERS[: len(nodes)], strict=True))
    )
    return [message_id for ids in sent for message_id in ids]


async def read_until(reader: Peer, since: int, count: int) -> list[Message]:
    """Fetch room:x from ``since`` until ``count`` messages came, a few at a time."""
    got: list[Message] = []
    async with asyncio.timeout(scaled(30)):
        while len(got) < count:
            page = await reader.fetch("room:x", since, limit=7)
            got += page.messages
            since = page.next_epoch
            if not page.messages:
                await asyncio.sleep(0.05)  # polling: the notes are still being sent
    return got


def epochs_in_log(db: Path) -> list[tuple[str, int]]:
    """(messageId, epoch) of each send_start in ``db``, in the log's order."""
    with sqlite3.connect(db) as conn:
        return list(
            conn.execute(
                "SELECT message_id, epoch FROM activity_log WHERE event = 'send_start' ORDER BY id"
            )
        )


async def test_a_reader_stopped_on_one_node_reads_on_exactly_from_its_cursor_on_another(cluster):
    """Senders on all three nodes send at once while a reader fetches on node a; stopped at a
    random point, it goes on from its cursor on node b: together it reads every note exactly
    once, in the same order as every node's log, where each note has the same epoch; each
    log's epochs strictly increase and every chain verifies."""
    tokens = {cid: cluster.token(cid) for cid in (*SENDERS, "w:9")}
    nodes = [await cluster.node(name) for name in ("a", "b", "c")]
    total = len(SENDERS) * PER_SENDER
    stop_after = random.randint(1, total - 10)
    sending = asyncio.ensure_future(send_all(cluster, nodes, tokens))
    async with peer(nodes[0], "w:9", tokens["w:9"], Inbox()) as reader:
        first = await read_until(reader, 0, stop_after)
    cursor = first[-1].epoch
    assert cursor is not None
    sent = await sending
    async with peer(nodes[1], "w:9", tokens["w:9"], Inbox()) as reader:
        rest = await read_until(reader, cursor, total - len(first))
        everything = [(m.message_id, m.epoch) for m in await read_until(reader, 0, total)]
    read = [(m.message_id, m.epoch) for m in first + rest]
    assert sorted(message_id for message_id, _ in read) == sorted(sent)  # each exactly once
    assert read == everything  # in the stream's order
    await cluster.close()
    for node in nodes:
        rows = epochs_in_log(node.db)
        epochs = [epoch for _, epoch in rows]
        assert epochs == sorted(set(epochs)), node.name  # strictly increasing
        notes = [row for row in rows if row[0] in set(sent)]
        assert notes == everything, node.name  # the same epoch on every node
    await the_audit_agrees(cluster.root, set(sent))


async def the_audit_agrees(root: Path, sent: set[str]) -> None:
    """`bcpbus audit` over the three logs gives each note one epoch on every node, and
    `audit verify` finds every chain intact."""
    dbs = ("--db", "a.db", "--db", "b.db", "--db", "c.db")
    code, out, err = await arun("audit", *dbs, "--event", "send_start", "--json", cwd=root)
    assert code == 0, err
    seen: dict[str, dict[str, int]] = {}
    for row in json.loads(out):
        if row["message_id"] in sent:
            seen.setdefault(row["message_id"], {})[row["node"]] = row["epoch"]
    assert seen.keys() == sent
    assert all(len(by_node) == 3 and len(set(by_node.values())) == 1 for by_node in seen.values())
    code, out, err = await arun("audit", "verify", *dbs, cwd=root)
    assert code == 0, out + err


async def test_a_subscriber_whose_node_is_killed_catches_up_on_another_exactly_once(cluster):
    """A subscriber on node a, given a's and b's URLs, loses a to kill -9 at a random point
    while senders on b and c send at once: the SDK reconnects to b and catches up from its
    cursor, and every note reaches it exactly once."""
    tokens = {cid: cluster.token(cid) for cid in (*SENDERS, "w:8", "watch:b")}
    a, b, c = [await cluster.node(name) for name in ("a", "b", "c")]
    watch, inbox = Inbox(reply=True), Inbox(reply=True)
    mover = Peer(f"{a.url},{b.url}", "w:8", tokens["w:8"])
    mover.handle(None, inbox)
    kill_after = random.randint(1, 2 * PER_SENDER - 5)
    async with peer(b, "watch:b", tokens["watch:b"], watch, "system:presence"), mover:
        await mover.subscribe("room:x")
        await joined(watch, "w:8")  # a's presence reached b: so did a's hello
        sending = asyncio.ensure_future(send_all(cluster, [b, c], tokens))
        async with asyncio.timeout(scaled(30)):
            while len(inbox.messages) < kill_after:
                await inbox.get(30)
        await a.stop(signal.SIGKILL)
        sent = set(await sending)
        async with asyncio.timeout(scaled(30)):
            while not sent <= {message.message_id for message in inbox.messages}:
                await inbox.get(30)
    assert mover.url == b.url
    got = [message.message_id for message in inbox.messages if message.message_id in sent]
    assert sorted(got) == sorted(sent)  # none missed, none twice
