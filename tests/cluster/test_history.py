"""The cluster's history on JetStream: what a node that was away missed, and NATS killed."""

from __future__ import annotations

import asyncio
import contextlib
import signal

from bus.core.errors import ClusterUnavailable
from peers import Peer
from peers.testing import Inbox, scaled
from tests.cli.test_operators import arun
from tests.cluster.test_cluster import joined, peer, rows


async def test_a_node_that_was_away_is_given_what_it_missed(cluster):
    """Node c is killed; the notes sent on node a meanwhile reach c's log once c is back (with
    the same name and database), each once and in order, so fetchMessages on c lists them."""
    tokens = {cid: cluster.token(cid) for cid in ("w:0", "w:1", "watch:a")}
    a, c = await cluster.node("a"), await cluster.node("c")
    watch = Inbox(reply=True)
    async with (
        peer(a, "watch:a", tokens["watch:a"], watch, "system:presence"),
        peer(a, "w:0", tokens["w:0"], Inbox()) as sender,
    ):
        async with peer(c, "w:1", tokens["w:1"], Inbox(reply=True), "room:x"):
            await joined(watch, "w:1")  # c's presence reached a: so did its hello
            before = await sender.send("room:x", "note", {"n": -1})
            assert before.delivered_to == 1
        await c.stop(signal.SIGKILL)
        missed = [await sender.send("room:x", "note", {"n": n}) for n in range(5)]
        assert [result.delivered_to for result in missed] == [0] * 5
        back = await cluster.node("c")
        async with peer(back, "w:1", tokens["w:1"], Inbox()) as reader:
            async with asyncio.timeout(scaled(20)):
                while True:
                    page = await reader.fetch("room:x", 0)
                    if len(page.messages) >= 6:
                        break
                    await asyncio.sleep(0.1)  # polling: c replays in the background
    expected = [before.message_id, *(result.message_id for result in missed)]
    assert [message.message_id for message in page.messages] == expected
    assert [message.payload["content"]["n"] for message in page.messages] == [-1, 0, 1, 2, 3, 4]
    await cluster.close()
    for result in missed:
        assert len(rows(back.db, "send_start", result.message_id)) == 1
        (received,) = rows(back.db, "cluster_in", result.message_id)
        assert received["status"] == "a"


async def test_nats_killed_mid_traffic_loses_no_acknowledged_rows(cluster):
    """kill -9 of nats-server while node a's sender publishes: sends are refused while it is
    gone; every message a acknowledged has its rows in a's log, each one node b counted is in
    b's log, traffic crosses again once the server is back, and both chains verify."""
    tokens = {cid: cluster.token(cid) for cid in ("w:0", "w:1", "w:2", "watch:a")}
    a, b = await cluster.node("a"), await cluster.node("b")
    watch = Inbox(reply=True)
    acknowledged = []
    refused = 0
    async with contextlib.AsyncExitStack() as peers:
        await peers.enter_async_context(
            peer(a, "watch:a", tokens["watch:a"], watch, "system:presence")
        )
        await peers.enter_async_context(peer(a, "w:1", tokens["w:1"], Inbox(reply=True), "room:x"))
        sender = await peers.enter_async_context(peer(a, "w:0", tokens["w:0"], Inbox()))
        await peers.enter_async_context(peer(b, "w:2", tokens["w:2"], Inbox(reply=True), "room:x"))
        await joined(watch, "w:2")
        async with asyncio.timeout(scaled(60)):
            number = 0
            while len(acknowledged) < 30 or acknowledged[-1].delivered_to < 2:
                if number == 10:
                    await cluster.nats.stop(signal.SIGKILL)
                if number == 20:
                    await cluster.nats.start()
                number += 1
                try:
                    acknowledged.append(await sender.send("room:x", "note", {"n": number}))
                except ClusterUnavailable:
                    refused += 1
                    await asyncio.sleep(0.1)  # polling: node a's reconnect is not observable
    assert [r.delivered_to for r in acknowledged[:10]] == [2] * 10
    assert refused > 0  # a noticed the server was gone and refused rather than pretended
    await cluster.close()
    for result in acknowledged:
        assert rows(a.db, "send_start", result.message_id)
        assert rows(a.db, "send_finish", result.message_id)
        if result.delivered_to == 2:
            assert rows(b.db, "send_start", result.message_id)
    for db in ("a.db", "b.db"):
        code, out, err = await arun("audit", "verify", "--db", db, cwd=cluster.root)
        assert code == 0, out + err


async def test_a_peer_whose_node_is_killed_resumes_on_another_node(cluster):
    """A subscriber on node a, given a's and c's URLs, loses a to kill -9 and resumes on c
    with its cursor: every note sent (on node b), before the move and after, reaches it
    exactly once (a cursor means the same on every node)."""
    tokens = {cid: cluster.token(cid) for cid in ("w:0", "w:1", "watch:b")}
    a, b, c = [await cluster.node(name) for name in ("a", "b", "c")]
    watch, inbox = Inbox(reply=True), Inbox(reply=True)
    mover = Peer(f"{a.url},{c.url}", "w:1", tokens["w:1"])
    mover.handle(None, inbox)
    async with (
        peer(b, "watch:b", tokens["watch:b"], watch, "system:presence"),
        peer(b, "w:0", tokens["w:0"], Inbox()) as sender,
        mover,
    ):
        await mover.subscribe("room:x")
        await joined(watch, "w:1")  # a's presence reached b: so did a's hello
        before = [await sender.send("room:x", "note", {"n": n}) for n in range(3)]
        assert [result.delivered_to for result in before] == [1, 1, 1]
        await a.stop(signal.SIGKILL)
        after = [await sender.send("room:x", "note", {"n": n}) for n in range(3, 8)]
        wanted = {result.message_id for result in [*before, *after]}
        async with asyncio.timeout(scaled(30)):
            while not wanted <= {message.message_id for message in inbox.messages}:
                await inbox.get(30)
    assert mover.url == c.url
    got = [message.message_id for message in inbox.messages]
    for result in [*before, *after]:
        assert got.count(result.message_id) == 1


async def test_a_nats_server_back_without_its_store_is_given_it_again(cluster):
    """nats-server restarted on an empty store (no stream, no consumers, no bucket): the nodes
    make them again on reconnect (the first one the stream) and messages cross again, under a
    new base: each log's epochs still strictly increase, and agree across the nodes."""
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
        cluster.nats.store = cluster.root / "empty-store"
        await cluster.nats.start()
        async with asyncio.timeout(scaled(30)):
            while True:  # until both nodes are back on NATS, with the stores made again
                try:
                    result = await sender.send("room:x", "note", {"text": "again"})
                except ClusterUnavailable:
                    result = None
                if result is not None and result.delivered_to == 1:
                    break
                await asyncio.sleep(0.2)  # polling: the nodes' reconnects are not observable
        assert (await inbox.get(10)).payload["content"]["text"] == "again"
    await cluster.close()
    lost = [
        [row["status"] for row in rows(db, "cluster_node") if row["status"].endswith("_lost")]
        for db in (a.db, b.db)
    ]
    # Each node made its part again once; the first to come back made the stream.
    assert all(len(statuses) == 1 for statuses in lost)
    assert ["stream_lost"] in lost
    for db in (a.db, b.db):
        epochs = [row["epoch"] for row in rows(db, "send_start")]
        assert epochs == sorted(set(epochs)), db
    assert [row["epoch"] for row in rows(a.db, "send_start", result.message_id)] == [
        row["epoch"] for row in rows(b.db, "send_start", result.message_id)
    ]
