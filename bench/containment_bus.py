"""The reference channel of ``bench containment``, and its answers sent through a real bus.

:func:`reference` reads the ``research-findings`` spec and the channel's ``anomaly_action`` from
the reference agents (``agents/main.md`` and ``agents/researcher.md``), as the gateway does.
:func:`compare` starts a bus with its gateway in this process (as ``bcpbus serve`` does), on a
copy of those agents whose budgets are raised so that every push fits, connects
``agent:researcher`` and ``agent:main`` over WebSocket, publishes each answer and checks that
the bus's verdict, and the delivery, are the in-process ones.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from bus.assemble import running
from bus.core.identities import default_agents_dir, load_identities
from bus.ops.credentials import Credentials
from peers.bcp import Controller, Reader
from peers.client import Peer
from peers.gateway.core.sealed import sealed_charge
from peers.gateway.runner import running_gateway
from peers.gateway.settings import GatewaySettings
from peers.gateway.validation import ValidationResult, validate_response
from schemas.agents import build_channels, load_agents
from schemas.bcp import (
    AnomalyAction,
    BcpResponseDelivery,
    BcpValidationResult,
    QuerySpec,
    SealedValue,
)
from schemas.common import GATEWAY_CLIENT_ID

__all__ = ["SUBSCRIPTION", "answer", "compare", "reference"]

SUBSCRIPTION = "research-findings"
TOPIC = "Public text sample"
RELEVANCE = "3"
_BUDGET = 1.0e15
_WAIT = 30.0


def answer(finding: str) -> dict[str, str]:
    """The ``research-findings`` answer that carries ``finding``; the rest is fixed."""
    return {"topic": TOPIC, "finding": finding, "relevance": RELEVANCE}


def _agents_dir() -> Path:
    found = default_agents_dir()
    if found is None:
        raise SystemExit("bench containment: the reference agents (agents/) are not installed")
    return found


def reference() -> tuple[QuerySpec, AnomalyAction]:
    """The reference ``research-findings`` spec and its channel's ``anomaly_action``."""
    channel = build_channels(load_agents(_agents_dir()))["main", "researcher"]
    subscription = channel.subscription(SUBSCRIPTION)
    if subscription is None:
        raise SystemExit(f"bench containment: agents/main.md has no {SUBSCRIPTION} subscription")
    return subscription.as_spec(), channel.anomaly_action


def _copy_agents(target: Path, action: AnomalyAction) -> Path:
    """Copy the reference agents with budgets no run spends, ``action`` on both sides, and
    pushes allowed back to back (the default ``min_interval_s`` would refuse all but one)."""
    target.mkdir()
    for path in _agents_dir().glob("*.md"):
        _, front, body = path.read_text(encoding="utf-8").split("---\n", 2)
        data = yaml.safe_load(front)
        for channel in data.get("bcp_channels", []):
            channel["budget_bits"] = _BUDGET
            channel["anomaly_action"] = action
            for subscription in channel.get("subscriptions", []):
                subscription["min_interval_s"] = 0.001
        text = f"---\n{yaml.safe_dump(data, sort_keys=False)}---\n{body}"
        (target / path.name).write_text(text, encoding="utf-8")
    return target


async def compare(texts: Sequence[str], action: AnomalyAction, loop: str) -> dict[str, Any]:
    """Publish each of ``texts`` as a finding on a real bus; compare with validation in process.

    Returns:
        ``answers``, ``same``, ``delivered`` and ``differ`` (the answers whose bus verdict or
        delivery is not the in-process one, with both).
    """
    del loop  # the bus runs in this process, on its loop
    if not texts:
        return {"skipped": "no answers to send"}
    spec, _ = reference()
    with tempfile.TemporaryDirectory(prefix="bench-containment-") as tmp:
        agents = _copy_agents(Path(tmp) / "agents", action)
        credentials = Credentials.empty()
        token = credentials.add_ephemeral
        async with (
            running(
                Path(tmp) / "bus.db", credentials=credentials, identities=load_identities(agents)
            ) as bus,
            running_gateway(
                bus.url,
                token(GATEWAY_CLIENT_ID, []),
                bus.log,
                agents,
                GatewaySettings(query_ttl=60, approval_timeout=600),
            ),
        ):
            controller = Controller(Peer(bus.url, "agent:main", token("agent:main", [])))
            reader = Reader(Peer(bus.url, "agent:researcher", token("agent:researcher", [])))
            deliveries: asyncio.Queue[BcpResponseDelivery] = asyncio.Queue()

            async def delivered(content: dict[str, Any]) -> None:
                deliveries.put_nowait(BcpResponseDelivery.model_validate(content))

            controller.on_delivery(delivered)
            async with controller, reader:
                return await _publish_all(texts, spec, action, reader, deliveries)
    raise AssertionError("unreachable")  # pragma: no cover - the with block returns


async def _publish_all(
    texts: Sequence[str],
    spec: QuerySpec,
    action: AnomalyAction,
    reader: Reader,
    deliveries: asyncio.Queue[BcpResponseDelivery],
) -> dict[str, Any]:
    same, delivered, differ = 0, 0, []
    for text in texts:
        expected = validate_response(spec, answer(text), anomaly_action=action)
        verdict = await reader.publish(SUBSCRIPTION, "main", answer(text), timeout=_WAIT)
        got: BcpResponseDelivery | None = None
        if verdict.success and not expected.approval_required:
            async with asyncio.timeout(_WAIT):
                got = await deliveries.get()
            delivered += 1
        if _agrees(spec, expected, verdict, got):
            same += 1
        else:
            differ.append({"finding": text, "in_process": expected.detail(), "bus": verdict.detail})
    return {"answers": len(texts), "same": same, "delivered": delivered, "differ": differ}


def _agrees(
    spec: QuerySpec,
    expected: ValidationResult,
    verdict: BcpValidationResult,
    got: BcpResponseDelivery | None,
) -> bool:
    if not expected.accepted:
        reasons = {(r.field, r.code) for r in verdict.reasons}
        return not verdict.success and reasons == {(r.field, r.code) for r in expected.reasons}
    if expected.approval_required:
        return verdict.success and got is None
    return (
        verdict.success
        and got is not None
        and _same_values(got, expected.response or {})
        # A flag channel delivers codes only; the charge is what the value carries.
        and {(a.code, a.field) for a in got.anomalies}
        == ({(a.code, a.field) for a in expected.anomalies} if got.anomalies else set())
        and _charged_as_measured(
            got, sealed_charge(spec, expected.response or {}, expected.value_bits)
        )
    )


def _same_values(got: BcpResponseDelivery, expected: Mapping[str, Any]) -> bool:
    """The delivered values are the validated ones; a sealed one is its handle and the text's
    word count, and never the text (it is not delivered to the controller)."""
    if list(got.response) != list(expected):
        return False
    for key, value in got.response.items():
        if isinstance(value, SealedValue):
            if value.words != len(str(expected[key]).split()):
                return False
        elif value != expected[key]:
            return False
    return True


def _charged_as_measured(got: BcpResponseDelivery, measured: float) -> bool:
    """The delivery's value bits are what validation measured (a sealed field: its facts');
    on a flag channel (its frame has a ``bits`` object whose value counts the codes too) never
    less."""
    if abs(got.bandwidth_bits - measured) < 0.01:
        return True
    return bool(got.anomalies) or got.bandwidth_bits > measured
