"""BCP across bus nodes: the gateway on one node, the controller and the reader on others.

Real processes: a ``nats-server``, three ``bcpbus serve --cluster --no-gateway`` nodes with the
built-in policy and the reference agents, and ``bcpbus gateway`` alone with its own database,
restarted on another node with the same database.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from bus.ops.credentials import Credentials
from peers import Approver, Controller, Peer, QueryFailed, Reader
from peers.testing import Inbox, scaled
from schemas.bcp import BcpResponseDelivery, SealedValue
from tests.cli.test_operators import arun
from tests.cluster.conftest import BCPBUS, ENV, Cluster, NatsServer, Node
from tests.cluster.test_cluster import rows

CAT1 = {"category": 1, "fields": [{"name": "ok", "type": "boolean"}]}
CAT3 = {"category": 3, "directive": "Summarize the document.", "max_words": 40}
ALERT = {"has_breaking_news": True, "priority": "high"}
FINDING = {"topic": "Pricing", "finding": "The enterprise plan doubles in price.", "relevance": "4"}
PEERS = ("agent:main", "agent:researcher", "system:gateway", "human:ana", "tg:ana")


@pytest.fixture
async def bcp_cluster(tmp_path: Path, nats: NatsServer) -> AsyncIterator[Cluster]:
    Credentials.empty().save(tmp_path / "bcpbus-peers.yaml")
    group = Cluster(tmp_path, nats, policy=False)
    try:
        yield group
    finally:
        await group.close()


@asynccontextmanager
async def gateway(cluster: Cluster, token: str, *nodes: Node) -> AsyncIterator[str]:
    """``bcpbus gateway --url`` the nodes (the first that answers) with ``gateway.db``; yields
    the URL it connected to and checks that it stops cleanly on SIGTERM."""
    urls = ",".join(node.url for node in nodes)
    with (cluster.root / "gateway.log").open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            BCPBUS,
            *("--info", "gateway", "--url", urls, "--db", "gateway.db"),
            cwd=cluster.root,
            stdout=subprocess.PIPE,
            stderr=log,
            env={**ENV, "BCPBUS_TOKEN": token},
        )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(scaled(30)):
            line = (await process.stdout.readline()).decode().strip()
        assert line.startswith("gateway connected to "), line
        yield line.removeprefix("gateway connected to ")
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(scaled(30)):
            assert await process.wait() == 0


async def ask_when_meshed(controller: Controller, spec: dict[str, Any]) -> Any:
    """``controller.ask`` once the nodes know each other: until then the query finds no
    gateway, or the gateway finds no reader (the nodes' hellos are not observable here)."""
    async with asyncio.timeout(scaled(20)):
        while True:
            try:
                return await controller.ask("researcher", spec, timeout=scaled(10))
            except QueryFailed as failed:
                if failed.reason not in ("gateway_unavailable", "reader_unavailable"):
                    raise
            await asyncio.sleep(0.2)  # polling: the next hello is at most a second away


def cost(delivery: BcpResponseDelivery) -> float:
    """What a delivery was charged, all told."""
    assert delivery.bits is not None
    return delivery.bits.value + delivery.bits.outcome + delivery.bits.timing


async def budget_left(root: Path) -> float:
    """What channel main -> researcher has left, as the gateway's database says."""
    code, out, err = await arun("audit", "--db", "gateway.db", "--bits", "--json", cwd=root)
    assert code == 0, err
    (channel,) = json.loads(out)
    assert channel["channel"] == "bcp:main:researcher"
    return float(channel["budget_left"])


async def verify_every_log(root: Path, *names: str) -> None:
    """`bcpbus audit verify` is clean for each node's log and the gateway's."""
    dbs = [arg for name in names for arg in ("--db", f"{name}.db")]
    code, out, err = await arun("audit", "verify", *dbs, cwd=root)
    assert code == 0, out + err
    assert out.count("ok: ") == len(names)


async def test_a_query_and_a_push_cross_three_nodes(bcp_cluster):
    """Gateway on node a, controller on b, reader on c: a Cat-1 query is answered and
    delivered, a reader's push reaches the controller, and every log verifies."""
    tokens = {cid: bcp_cluster.token(cid) for cid in PEERS}
    a, b, c = [await bcp_cluster.node(name) for name in ("a", "b", "c")]
    pushes: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(gateway(bcp_cluster, tokens["system:gateway"], a))
        controller = Controller(Peer(b.url, "agent:main", tokens["agent:main"]))
        controller.on_delivery(pushes.put)
        reader = Reader(Peer(c.url, "agent:researcher", tokens["agent:researcher"]))

        @reader.on_query
        async def answer(query: dict[str, Any]) -> dict[str, Any]:
            return {"ok": True}

        await stack.enter_async_context(controller)
        await stack.enter_async_context(reader)
        delivery = await ask_when_meshed(controller, CAT1)
        assert delivery.response == {"ok": True} and delivery.from_agent == "researcher"
        verdict = await reader.publish("research-alerts", "main", ALERT, timeout=scaled(10))
        assert verdict.success, verdict
        async with asyncio.timeout(scaled(10)):
            pushed = await pushes.get()
        assert pushed["subscription_id"] == "research-alerts"
        assert pushed["response"] == ALERT
    await bcp_cluster.close()
    await verify_every_log(bcp_cluster.root, "a", "b", "c", "gateway")


async def approve_when_back(
    approver: Approver, approval_id: str, answered: asyncio.Task[Any]
) -> None:
    """Approve ``approval_id`` once the gateway has failed over. A decision sent while it was
    away is not taken at once, but may reach it in its catch-up: then ``answered`` ends."""
    async with asyncio.timeout(scaled(20)):
        while True:
            if await approver.approve(approval_id) or answered.done():
                return
            await asyncio.sleep(0.2)  # polling: the gateway retries its next URL within a second


async def test_the_gateway_fails_over_and_restarts_on_another_node_with_its_state(bcp_cluster):
    """Node a, the gateway's, is killed: the gateway reconnects to c and the approval that was
    open there is decided and delivered. The gateway then restarts on c with its database: the
    budget goes on from what was paid, a sealed handle issued on a still forwards, and the
    approval open at the restart ends as a restart ends it on one bus (expired, its query
    failed with timeout, its reserve given back but for a failure's cost)."""
    tokens = {cid: bcp_cluster.token(cid) for cid in PEERS}
    a, b, c = [await bcp_cluster.node(name) for name in ("a", "b", "c")]
    pushes: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    chat = Inbox(reply=True)
    async with AsyncExitStack() as stack:
        controller = Controller(Peer(b.url, "agent:main", tokens["agent:main"]))
        controller.on_delivery(pushes.put)
        reader = Reader(Peer(c.url, "agent:researcher", tokens["agent:researcher"]))

        @reader.on_query
        async def answer(query: dict[str, Any]) -> dict[str, Any]:
            return {"summary": "Prices rise."} if query["category"] == 3 else {"ok": True}

        approver = Approver(Peer(b.url, "human:ana", tokens["human:ana"]))
        person = Peer(b.url, "tg:ana", tokens["tg:ana"])
        person.handle("tg_reply", chat)
        for part in (controller, reader, approver, person):
            await stack.enter_async_context(part)
        async with gateway(bcp_cluster, tokens["system:gateway"], a, c):
            paid = cost(await ask_when_meshed(controller, CAT1))
            verdict = await reader.publish("research-findings", "main", FINDING, timeout=scaled(10))
            assert verdict.success, verdict
            async with asyncio.timeout(scaled(10)):
                pushed = BcpResponseDelivery.model_validate(await pushes.get())
            paid += cost(pushed)
            sealed = pushed.response["finding"]
            assert isinstance(sealed, SealedValue)
            summary = asyncio.create_task(controller.ask("researcher", CAT3, timeout=scaled(30)))
            async with asyncio.timeout(scaled(10)):
                request = await approver.next_request()
            await a.stop(signal.SIGKILL)
            await approve_when_back(approver, request.approval_id, summary)
            delivered = await summary
            assert delivered.response["summary"] == "Prices rise."
            paid += cost(delivered)
            unanswered = asyncio.create_task(controller.ask("researcher", CAT3, timeout=scaled(30)))
            async with asyncio.timeout(scaled(10)):
                left_open = await approver.next_request()
        assert await budget_left(bcp_cluster.root) == 0  # the open summary's reserve took it all
        async with gateway(bcp_cluster, tokens["system:gateway"], c, b):
            with pytest.raises(QueryFailed) as failed:
                await unanswered
            assert failed.value.reason == "timeout"
            assert not await approver.approve(left_open.approval_id)
            forwarded = await controller.forward(
                "researcher", "tg:ana", "tg_reply", {"text": sealed.ref()}, timeout=scaled(10)
            )
            assert forwarded.success
            assert (await chat.get(10)).content["text"] == FINDING["finding"]
            paid += cost(await ask_when_meshed(controller, CAT1))
        # What was paid before the restart still counts; the restart gave the open summary's
        # reserve back but for what a failure costs (under 4 bits: the slack is for queries
        # that found no reader while the nodes met, a failure each).
        left = await budget_left(bcp_cluster.root)
        assert 2000 - paid - 40 < left < 2000 - paid
    await bcp_cluster.close()
    logins = [row["actor"] for row in rows(c.db, "initialize")]
    assert logins.count("system:gateway") == 2  # the failover, then the restart
    await verify_every_log(bcp_cluster.root, "a", "b", "c", "gateway")
