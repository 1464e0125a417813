"""The cluster link in-process: two buses on a real nats-server, and its pure parts."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from nats import connect as connect_to_nats

from bus.core.policy import Policy
from bus.ops.config import ConfigError, ServeConfig
from bus.ops.startup import StartupError
from bus.transports.cluster import ClusterLink, joined, presence_key, subject_for
from bus.transports.cluster_wire import HISTORY_STREAM, SUBJECT_PREFIX
from peers.testing import BusHarness, Inbox, running_bus, scaled
from tests.cli.test_operators import arun
from tests.cluster.conftest import POLICY, NatsServer

# Node b's workers may listen in rooms but may not speak there.
MUTE_POLICY = POLICY.replace('topics: ["room:*", "w:*"]', 'topics: ["w:*"]')


async def start_node(
    stack: AsyncExitStack, directory: Path, nats: NatsServer, name: str, policy: str
) -> BusHarness:
    """A bus with ``policy`` in ``directory``, joined to the cluster on ``nats`` as ``name``."""
    harness = await stack.enter_async_context(
        running_bus(directory, policy=Policy.from_yaml(policy))
    )
    await stack.enter_async_context(ClusterLink(harness.bus, nats.url, node=name))
    return harness


def test_subjects_follow_topics_and_escape_dots():
    """A topic's segments become subject tokens; a dot inside a segment cannot split one."""
    assert subject_for("bcp:main:researcher") == "bcpbus.msg.bcp.main.researcher"
    assert subject_for("room:v1.2") == "bcpbus.msg.room.v1%2E2"


def test_presence_keys_are_valid_key_value_keys():
    """A clientId with ':' (not allowed in a key) maps to a distinct key of allowed characters."""
    keys = {presence_key(cid) for cid in ("agent:main", "agent:mai", "tg:42", "human:ana")}
    assert len(keys) == 4
    assert all(
        set(key) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        for key in keys
    )


def test_the_config_file_names_the_cluster(tmp_path):
    """``cluster: {url, node}`` in the config file; a URL that is not nats:// is refused."""
    config = ServeConfig.from_mapping(
        {"cluster": {"url": "nats://10.0.0.5:4222", "node": "n1"}}, base=tmp_path, source="x"
    )
    assert (config.cluster.url, config.cluster.node) == ("nats://10.0.0.5:4222", "n1")
    with pytest.raises(ConfigError, match="cluster"):
        ServeConfig.from_mapping({"cluster": {"url": "http://x"}}, base=tmp_path, source="x")


async def test_serve_node_without_cluster_is_one_clear_line(tmp_path):
    """``serve --node`` with no NATS URL anywhere says what is missing, in one line."""
    code, _, err = await arun("serve", "--port", "0", "--node", "a", cwd=tmp_path)
    assert code != 0
    assert "--cluster nats://HOST:PORT" in err and len(err.strip().splitlines()) == 1


async def test_a_nats_server_that_is_not_there_stops_the_start(tmp_path):
    """Joining a cluster whose NATS server cannot be reached is a StartupError naming it."""
    async with running_bus(tmp_path) as harness:
        with pytest.raises(StartupError, match="cannot be reached"):
            async with joined(harness.bus, "nats://127.0.0.1:1", "a"):
                pass
        assert harness.bus.cluster is None


async def test_a_node_takes_the_nats_server_that_answers_of_several(tmp_path, nats):
    """``--cluster`` with a comma list of NATS servers joins through one that answers."""
    async with running_bus(tmp_path) as harness:
        async with joined(harness.bus, f"nats://127.0.0.1:1,{nats.url}", "a") as link:
            assert harness.bus.cluster is link
            link.check()  # connected: no ClusterUnavailable


@pytest.fixture
def node_b_dir(tmp_path: Path) -> Path:
    (tmp_path / "b").mkdir()
    return tmp_path / "b"


@pytest.mark.usefixtures("node_b_dir")
async def test_a_node_refuses_what_its_own_policy_refuses(tmp_path, nats):
    """Node a accepts a note to a room; node b, whose policy forbids that note, delivers
    nothing to its subscriber and writes a refused row naming node a instead."""
    async with AsyncExitStack() as stack:
        a = await start_node(stack, tmp_path, nats, "a", POLICY)
        b = await start_node(stack, tmp_path / "b", nats, "b", MUTE_POLICY)
        b.credentials = b.bus.credentials = a.credentials  # the same peers file on both nodes
        listener = Inbox(reply=True)
        speaker = await stack.enter_async_context(a.peer("w:0"))
        hearer = b.peer("w:2")
        hearer.handle(None, listener)
        await stack.enter_async_context(hearer)
        await hearer.subscribe("room:x")
        link = a.bus.cluster
        assert isinstance(link, ClusterLink)
        async with asyncio.timeout(scaled(10)):
            await link.wait_for_node("b")
        result = await speaker.send("room:x", "note", {"text": "psst"})
        assert result.delivered_to == 0
        assert listener.empty()
        await b.log.commit()
        refused = b.rows(event="refused", message_id=result.message_id)
    assert [(r["status"], json.loads(r["payload_json"])["node"]) for r in refused] == [
        ("type_denied", "a")
    ]


async def test_a_nats_server_without_jetstream_is_named_as_such(tmp_path):
    """A NATS server without JetStream is reached but refused, with the flag that fixes it."""
    plain = NatsServer(tmp_path / "plain-store", jetstream=False)
    await plain.start()
    try:
        async with running_bus(tmp_path) as harness:
            with pytest.raises(StartupError, match="-js"):
                async with joined(harness.bus, plain.url, "a"):
                    pass
    finally:
        await plain.stop()


@pytest.mark.usefixtures("node_b_dir")
async def test_list_peers_answers_for_the_whole_cluster(tmp_path, nats):
    """An operator on node a sees the peers of node b too, their address naming node b."""
    policy = POLICY + (
        '  operator:\n    description: Operators.\n    members: ["operator:*"]\n'
        "    admin: true\n    send: []\n    subscribe: []\n"
    )
    async with AsyncExitStack() as stack:
        a = await start_node(stack, tmp_path, nats, "a", policy)
        b = await start_node(stack, tmp_path / "b", nats, "b", policy)
        b.credentials = b.bus.credentials = a.credentials
        operator = await stack.enter_async_context(a.peer("operator:ana"))
        await stack.enter_async_context(b.peer("w:2"))
        link = a.bus.cluster
        assert isinstance(link, ClusterLink)
        async with asyncio.timeout(scaled(10)):
            await link.wait_for_node("b")
        listed = await operator.request("listPeers")
    where = {p["clientId"]: p["address"] for p in listed["peers"]}
    assert list(where) == ["operator:ana", "w:2"]
    assert where["w:2"].startswith("b ") and not where["operator:ana"].startswith("b ")


async def test_a_stream_made_with_a_shorter_duplicate_window_is_widened_to_the_buses(
    tmp_path, nats
):
    """A history stream made before (JetStream's 2-minute duplicate window) is widened to the
    bus's dedup_window when a node joins, so a resend within it is never stored twice."""
    client = await connect_to_nats(nats.url)
    js = client.jetstream()
    await js.add_stream(name=HISTORY_STREAM, subjects=[f"{SUBJECT_PREFIX}.>"])
    before = (await js.stream_info(HISTORY_STREAM)).config.duplicate_window
    await client.close()
    async with running_bus(tmp_path) as harness:
        window = harness.bus.limits.dedup_window
        async with ClusterLink(harness.bus, nats.url, node="a"):
            pass
    client = await connect_to_nats(nats.url)
    info = await client.jetstream().stream_info(HISTORY_STREAM)
    await client.close()
    assert before == 120
    assert window == 300
    assert info.config.duplicate_window == window
