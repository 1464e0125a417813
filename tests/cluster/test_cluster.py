"""Bus nodes on NATS acting as one bus: real ``nats-server`` and ``bcpbus serve`` processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from bus.core.errors import ClusterUnavailable
from peers import Peer
from peers.testing import Inbox, scaled
from tests.cli.test_operators import arun
from tests.cluster.conftest import Node


def rows(db: Path, event: str, message_id: str | None = None) -> list[sqlite3.Row]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        sql = "SELECT * FROM activity_log WHERE event = ?"
        args: list[str] = [event]
        if message_id is not None:
            sql += " AND message_id = ?"
            args.append(message_id)
        return list(conn.execute(sql + " ORDER BY id", args))


async def joined(watch: Inbox, client_id: str) -> None:
    """Wait until ``watch`` (a presence subscriber) hears ``client_id`` join, wherever."""
    while True:
        message = await watch.get_type("peer_joined", 10)
        if message.payload["content"]["clientId"] == client_id:
            return


@asynccontextmanager
async def peer(
    node: Node, client_id: str, token: str, inbox: Inbox, *topics: str
) -> AsyncIterator[Peer]:
    """A peer connected to ``node`` (never reconnecting), its deliveries in ``inbox``."""
    member = Peer(node.url, client_id, token, reconnect=False)
    member.handle(None, inbox)
    async with member:
        for topic in topics:
            await member.subscribe(topic)
        yield member


async def test_a_message_reaches_subscribers_on_every_node_and_counts_their_answers(cluster):
    """A sendMessage on node a is delivered once to the room's subscribers on a, b and c; its
    deliveredTo counts all three, and every node gives it the same epoch (its stream's)."""
    tokens = {cid: cluster.token(cid) for cid in ("w:0", "w:1", "w:2", "w:3", "watch:a")}
    a, b, c = [await cluster.node(name) for name in ("a", "b", "c")]
    watch = Inbox(reply=True)
    inboxes = [Inbox(reply=True) for _ in range(3)]
    async with (
        peer(a, "watch:a", tokens["watch:a"], watch, "system:presence"),
        peer(a, "w:1", tokens["w:1"], inboxes[0], "room:x"),
        peer(b, "w:2", tokens["w:2"], inboxes[1], "room:x"),
        peer(c, "w:3", tokens["w:3"], inboxes[2], "room:x"),
        peer(a, "w:0", tokens["w:0"], Inbox()) as sender,
    ):
        for client_id in ("w:2", "w:3"):  # presence from b and c reached a: so did their hellos
            await joined(watch, client_id)
        result = await sender.send("room:x", "note", {"text": "hello"})
        assert result.delivered_to == 3
        got = [await inbox.get(10) for inbox in inboxes]
        assert {m.payload["content"]["text"] for m in got} == {"hello"}
        assert [m.epoch for m in got] == [result.epoch] * 3
        assert all(inbox.empty() for inbox in inboxes)  # once each
    await cluster.close()
    message_id = result.message_id
    (finish,) = rows(a.db, "send_finish", message_id)
    assert finish["status"] == "delivered 3/3"
    (out,) = rows(a.db, "cluster_out", message_id)
    assert json.loads(out["payload_json"]) == {"b": [1, 1], "c": [1, 1]}
    for node in (b, c):
        (received,) = rows(node.db, "cluster_in", message_id)
        assert json.loads(received["payload_json"])["node"] == "a"
        (start,) = rows(node.db, "send_start", message_id)
        assert start["actor"] == "w:0" and start["epoch"] == result.epoch
    await audit_follows_the_message_across_logs(cluster.root, message_id)


async def audit_follows_the_message_across_logs(root: Path, message_id: str) -> None:
    """`bcpbus audit` with the three logs shows the message's rows on every node in time
    order, none before its send_start on the node that accepted it, its send_start on each
    with the same epoch; `audit verify` checks each chain."""
    dbs = ("--db", "a.db", "--db", "b.db", "--db", "c.db")
    code, out, err = await arun("audit", *dbs, "--message-id", message_id, "--json", cwd=root)
    assert code == 0, err
    story = json.loads(out)
    origin = next(row["node"] for row in story if row["event"] == "cluster_out")
    assert (story[0]["node"], story[0]["event"]) == (origin, "send_start")
    later = [row["ts"] for row in story if row["node"] == origin or row["ts"] > story[0]["ts"]]
    assert later == sorted(later)
    starts = [(row["node"], row["epoch"]) for row in story if row["event"] == "send_start"]
    assert sorted(node for node, _ in starts) == ["a", "b", "c"]
    assert len({epoch for _, epoch in starts}) == 1
    delivered = {(row["node"], row["actor"]) for row in story if row["event"] == "process_finish"}
    assert delivered == {("a", "w:1"), ("b", "w:2"), ("c", "w:3")}
    code, out, err = await arun("audit", "verify", *dbs, cwd=root)
    assert code == 0, out + err
    headers = [line for line in out.splitlines() if line.endswith(".db):")]
    assert headers == ["a (a.db):", "b (b.db):", "c (c.db):"]
    assert out.count("ok: ") == 3


async def test_a_second_login_on_another_node_takes_over(cluster):
    """w:1 logging in on node b closes its older link on node a with 4001, and what is sent
    to it afterwards from a reaches it on b."""
    tokens = {cid: cluster.token(cid) for cid in ("w:0", "w:1", "watch:a")}
    a, b = await cluster.node("a"), await cluster.node("b")
    watch, old_inbox, new_inbox = Inbox(reply=True), Inbox(reply=True), Inbox(reply=True)
    async with (
        peer(a, "watch:a", tokens["watch:a"], watch, "system:presence"),
        peer(a, "w:0", tokens["w:0"], Inbox()) as sender,
    ):
        closed = asyncio.Event()
        old = Peer(
            a.url, "w:1", tokens["w:1"], reconnect=False, on_connection=lambda e: closed.set()
        )
        old.handle(None, old_inbox)
        await old.connect()
        async with peer(b, "w:1", tokens["w:1"], new_inbox):
            await joined(watch, "w:1")  # its own join on a
            await joined(watch, "w:1")  # and the one on b
            async with asyncio.timeout(scaled(10)):
                await closed.wait()
            result = await sender.send("w:1", "note", {"text": "where are you"})
            assert result.delivered_to == 1
            assert (await new_inbox.get(10)).payload["content"]["text"] == "where are you"
            assert old_inbox.empty()
        await old.close()
    await cluster.close()
    (replaced,) = rows(a.db, "replaced")
    assert replaced["actor"] == "w:1" and replaced["status"] == "4001" and replaced["error"] == "b"


async def test_a_node_cut_off_from_nats_refuses_sends_until_it_is_back(cluster):
    """With nats-server stopped, sendMessage on a node is answered -32011 and nothing is
    delivered; once the server is back the nodes reconnect and deliver across again."""
    tokens = {cid: cluster.token(cid) for cid in ("w:0", "w:1", "watch:a")}
    a, b = await cluster.node("a"), await cluster.node("b")
    watch, inbox = Inbox(reply=True), Inbox(reply=True)
    async with (
        peer(a, "watch:a", tokens["watch:a"], watch, "system:presence"),
        peer(b, "w:1", tokens["w:1"], inbox, "room:x"),
        peer(a, "w:0", tokens["w:0"], Inbox()) as sender,
    ):
        await joined(watch, "w:1")
        await cluster.nats.stop()
        with pytest.raises(ClusterUnavailable) as refused:
            async with asyncio.timeout(scaled(10)):
                while True:  # until node a has noticed the server is gone
                    await sender.send("room:x", "note", {"text": "lost"})
        assert refused.value.code == -32011
        await cluster.nats.start()
        async with asyncio.timeout(scaled(20)):
            while True:  # until both nodes are back on NATS and know each other again
                try:
                    result = await sender.send("room:x", "note", {"text": "back"})
                except ClusterUnavailable:
                    await asyncio.sleep(0.1)  # polling: node a's reconnect is not observable
                    continue
                if result.delivered_to == 1:
                    break
        texts = [m.payload["content"]["text"] for m in inbox.messages]
        assert "lost" not in texts and "back" in texts


async def test_a_node_killed_mid_traffic_loses_no_acknowledged_rows(cluster):
    """kill -9 of node b while node a's sender publishes: every message a acknowledged has its
    rows in a's log, senders on a go on (b stops counting), and both chains verify."""
    tokens = {cid: cluster.token(cid) for cid in ("w:0", "w:1", "w:2", "watch:a")}
    a, b = await cluster.node("a"), await cluster.node("b")
    watch = Inbox(reply=True)
    acknowledged: list[dict] = []
    async with contextlib.AsyncExitStack() as peers:
        await peers.enter_async_context(
            peer(a, "watch:a", tokens["watch:a"], watch, "system:presence")
        )
        await peers.enter_async_context(peer(a, "w:1", tokens["w:1"], Inbox(reply=True), "room:x"))
        sender = await peers.enter_async_context(peer(a, "w:0", tokens["w:0"], Inbox()))
        await peers.enter_async_context(peer(b, "w:2", tokens["w:2"], Inbox(reply=True), "room:x"))
        await joined(watch, "w:2")
        for number in range(40):
            if number == 10:
                await b.stop(signal.SIGKILL)
            acknowledged.append(await sender.send("room:x", "note", {"n": number}))
    assert [r.delivered_to for r in acknowledged[:10]] == [2] * 10
    assert acknowledged[-1].delivered_to == 1  # b is no longer waited for once it is silent
    await cluster.close()
    for result in acknowledged:
        assert rows(a.db, "send_start", result.message_id)
        assert rows(a.db, "send_finish", result.message_id)
    for db in ("a.db", "b.db"):
        code, out, err = await arun("audit", "verify", "--db", db, cwd=cluster.root)
        assert code == 0, out + err
