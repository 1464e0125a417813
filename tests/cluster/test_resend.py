"""A send answered -32011 that JetStream had stored after all is not delivered twice when its
sender sends it again (real nats-server, real nodes, the sending node behind a relay)."""

from __future__ import annotations

import pytest

from peers.errors import ClusterUnavailable, DuplicateMessage
from peers.testing import Inbox
from tests.cli.test_operators import arun
from tests.cluster.relay import relay_to
from tests.cluster.test_cluster import joined, peer, rows


async def test_a_resend_of_a_message_stored_before_its_minus_32011_comes_once(cluster):
    """Node a's link from NATS stalls right as w:0 sends: JetStream stores the note (node b
    delivers it) but a never hears back, so w:0 gets -32011; once the link flows again, a
    delivers it too, and w:0's resend with the same messageId gets -32008: each subscriber
    gets the note once, each log holds it once, and every chain verifies."""
    tokens = {cid: cluster.token(cid) for cid in ("w:0", "w:1", "w:2", "watch:a")}
    async with relay_to(cluster.nats.port) as relay:
        a = await cluster.node("a", relay.url)
        b = await cluster.node("b")
        watch = Inbox(reply=True)
        near, far = Inbox(reply=True), Inbox(reply=True)
        async with (
            peer(a, "watch:a", tokens["watch:a"], watch, "system:presence"),
            peer(a, "w:1", tokens["w:1"], near, "room:x"),
            peer(b, "w:2", tokens["w:2"], far, "room:x"),
            peer(a, "w:0", tokens["w:0"], Inbox()) as sender,
        ):
            await joined(watch, "w:2")  # b's presence reached a: so did its hello
            relay.hold()
            with pytest.raises(ClusterUnavailable):
                await sender.send("room:x", "note", {"n": 1}, message_id="m-1")
            first = await far.get(10)  # stored: b read it from the stream
            relay.release()
            assert (await near.get(10)).message_id == "m-1"  # a reads it once the link flows
            with pytest.raises(DuplicateMessage):
                await sender.send("room:x", "note", {"n": 1}, message_id="m-1")
            after = await sender.send("room:x", "note", {"n": 2}, message_id="m-2")
            assert after.delivered_to == 2
            for inbox in (near, far):  # delivered in the stream's order: m-1 would come first
                assert (await inbox.get(10)).message_id == "m-2"
                assert inbox.empty()
        await cluster.close()
    assert first.message_id == "m-1"
    assert after.epoch > first.epoch
    for node in (a, b):
        (start,) = rows(node.db, "send_start", "m-1")
        assert start["epoch"] == first.epoch, node.name
    (refused,) = [row for row in rows(a.db, "refused", "m-1") if row["status"] == "duplicate"]
    assert '"seq"' in refused["payload_json"]
    code, out, err = await arun("audit", "verify", "--db", "a.db", "--db", "b.db", cwd=cluster.root)
    assert code == 0, out + err


async def test_a_resend_on_another_node_is_refused_as_a_duplicate(cluster):
    """The same -32011, and w:0 resends from node b (as -32011 allows): JetStream knows the
    messageId, so b answers -32008 and delivers nothing more; the subscriber on b gets the
    note once."""
    tokens = {cid: cluster.token(cid) for cid in ("w:0", "w:2", "watch:a")}
    async with relay_to(cluster.nats.port) as relay:
        a = await cluster.node("a", relay.url)
        b = await cluster.node("b")
        watch, far = Inbox(reply=True), Inbox(reply=True)
        async with (
            peer(a, "watch:a", tokens["watch:a"], watch, "system:presence"),
            peer(b, "w:2", tokens["w:2"], far, "room:x"),
        ):
            await joined(watch, "w:2")
            async with peer(a, "w:0", tokens["w:0"], Inbox()) as sender:
                relay.hold()
                with pytest.raises(ClusterUnavailable):
                    await sender.send("room:x", "note", {"n": 1}, message_id="m-1")
            assert (await far.get(10)).message_id == "m-1"
            async with peer(b, "w:0", tokens["w:0"], Inbox()) as moved:
                with pytest.raises(DuplicateMessage):
                    await moved.send("room:x", "note", {"n": 1}, message_id="m-1")
                relay.release()  # else b waits for a's answer to the next note
                after = await moved.send("room:x", "note", {"n": 2}, message_id="m-2")
            assert (await far.get(10)).message_id == "m-2"  # m-1 would come first
            assert far.empty()
        await cluster.close()
    assert after.delivered_to == 1  # a answered: it read m-1 and m-2 by then
    for node in (a, b):
        assert len(rows(node.db, "send_start", "m-1")) == 1, node.name
