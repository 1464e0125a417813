"""Tests for bus/core/policy.py: the default policy's grants and refusals, pattern coverage,
load-time errors and the taint rule."""

from __future__ import annotations

import itertools
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, strategies as st

from bus.core.policy import (
    GATEWAY_ONLY_TYPES,
    Grants,
    Policy,
    PolicyError,
    Role,
    SendRule,
    _covers,
    _RoleFile,
    may_flow,
)
from schemas.common import TAINT_LEVELS

DEFAULT = Policy.default()

# The peers of the default policy, each with the roles its definition or peers file assigns.
PEERS: dict[str, tuple[str, ...]] = {
    "tg:123": (),
    "agent:system": (),
    "agent:worker": (),
    "agent:main": ("controller",),
    "agent:other": ("controller",),
    "agent:researcher": ("reader",),
    "agent:scout": ("reader",),
    "system:gateway": (),
    "human:alice": (),
    "auditor:carol": (),
    "system:screener-x": ("screener",),
}
NON_GATEWAY = [peer for peer in PEERS if peer != "system:gateway"]


def grants_of(client_id: str) -> Grants:
    return DEFAULT.grants(client_id, DEFAULT.roles_for(client_id, PEERS[client_id]))


# The default policy


@pytest.mark.parametrize(
    ("client_id", "roles"),
    [
        ("tg:123", {"tg"}),
        ("agent:system", {"system", "agent"}),
        ("agent:worker", {"agent"}),
        ("agent:main", {"agent", "controller"}),
        ("agent:researcher", {"agent", "reader"}),
        ("system:gateway", {"gateway"}),
        ("human:alice", {"approver"}),
        ("auditor:carol", {"auditor"}),
        ("system:screener-x", {"screener"}),
        ("other:peer", set()),
        ("system:other", set()),
        ("tg", set()),
    ],
)
def test_roles_for_default(client_id, roles):
    """Members patterns and assigned roles together give each peer its roles."""
    assert DEFAULT.roles_for(client_id, PEERS.get(client_id, ())) == roles


SEND_CASES = [
    # tg: a Telegram chat
    ("tg:123", "spawn_request", "system:spawn", True),
    ("tg:123", "configure", "agent:main", True),
    ("tg:123", "tg_message", "agent:researcher", True),
    ("tg:123", "spawn_request", "agent:main", False),
    ("tg:123", "configure", "system:spawn", False),
    ("tg:123", "tg_reply", "tg:456", False),
    ("tg:123", "spawn_result", "tg:123", False),
    ("tg:123", "agent_event", "agent:main", False),
    # system: agent:system
    ("agent:system", "spawn_result", "tg:123", True),
    ("agent:system", "route_assigned", "tg:123", True),
    ("agent:system", "agent_event", "agent:main", True),
    ("agent:system", "agent_event", "system:spawn", True),
    ("agent:system", "scheduled_message", "agent:researcher", True),
    ("agent:system", "scheduled_message", "tg:1", False),
    ("tg:123", "scheduled_message", "agent:main", False),
    ("agent:worker", "scheduled_message", "agent:main", False),
    ("agent:system", "spawn_request", "system:spawn", False),
    ("agent:system", "tg_message", "agent:main", False),
    ("agent:system", "spawn_result", "agent:main", False),
    # agent: any agent
    ("agent:worker", "tg_reply", "tg:123", True),
    ("agent:worker", "agent_event", "agent:main", True),
    ("agent:worker", "agent_event", "system:spawn", False),
    ("agent:worker", "spawn_result", "tg:123", False),
    ("agent:worker", "tg_reply", "agent:main", False),
    ("agent:worker", "bcp_query_request", "bcp:worker:researcher", False),
    ("agent:worker", "bcp_response", "bcp:main:worker", False),
    # controller: its own channels only
    ("agent:main", "bcp_query_request", "bcp:main:researcher", True),
    ("agent:main", "bcp_query_request", "bcp:other:researcher", False),
    ("agent:main", "bcp_query_request", "bcp:researcher:main", False),
    ("agent:main", "bcp_query_request", "agent:researcher", False),
    ("agent:main", "bcp_response", "bcp:main:researcher", False),
    ("agent:other", "bcp_query_request", "bcp:main:researcher", False),
    # reader: answers on its own channels only
    ("agent:researcher", "bcp_response", "bcp:main:researcher", True),
    ("agent:researcher", "bcp_response", "bcp:other:researcher", True),
    ("agent:researcher", "bcp_response", "bcp:main:scout", False),
    ("agent:researcher", "bcp_response", "bcp:researcher:main", False),
    ("agent:researcher", "bcp_response", "agent:main", False),
    ("agent:researcher", "bcp_query_request", "bcp:researcher:scout", False),
    ("agent:scout", "bcp_response", "bcp:main:researcher", False),
    # gateway
    ("system:gateway", "bcp_query", "agent:researcher", True),
    ("system:gateway", "bcp_validation_result", "agent:researcher", True),
    ("system:gateway", "bcp_subscriptions_active", "agent:researcher", True),
    ("system:gateway", "bcp_response_delivery", "agent:main", True),
    ("system:gateway", "bcp_query_failed", "agent:main", True),
    ("system:gateway", "bcp_approval_request", "system:approval", True),
    ("system:gateway", "bcp_approval_request", "agent:main", False),
    ("system:gateway", "bcp_query", "tg:123", False),
    ("system:gateway", "bcp_response_delivery", "bcp:main:researcher", False),
    ("system:gateway", "bcp_response", "bcp:main:researcher", False),
    ("system:gateway", "bcp_approval_decision", "system:approval", False),
    ("system:gateway", "bcp_screen_request", "system:screener-x", True),
    ("system:gateway", "bcp_screen_request", "agent:main", False),
    ("system:gateway", "bcp_screen_verdict", "system:gateway", False),
    # screener: a verdict to the gateway, nothing else
    ("system:screener-x", "bcp_screen_verdict", "system:gateway", True),
    ("system:screener-x", "bcp_screen_verdict", "agent:main", False),
    ("system:screener-x", "bcp_screen_verdict", "system:approval", False),
    ("system:screener-x", "agent_event", "agent:main", False),
    ("system:screener-x", "bcp_response", "bcp:main:researcher", False),
    ("agent:researcher", "bcp_screen_verdict", "system:gateway", False),
    # approver
    ("human:alice", "bcp_approval_decision", "system:approval", True),
    ("human:alice", "bcp_approval_decision", "agent:main", False),
    # auditor: reads, never decides
    ("auditor:carol", "bcp_approval_decision", "system:approval", False),
    ("human:alice", "bcp_approval_request", "system:approval", False),
]


@pytest.mark.parametrize(("client_id", "message_type", "topic", "allowed"), SEND_CASES)
def test_may_send_default(client_id, message_type, topic, allowed):
    """The default policy grants exactly the seed matrix and the BCP roles' sends."""
    assert grants_of(client_id).may_send(message_type, topic) is allowed


@pytest.mark.parametrize("client_id", NON_GATEWAY)
@pytest.mark.parametrize("message_type", sorted(GATEWAY_ONLY_TYPES))
@pytest.mark.parametrize("topic", ["agent:main", "agent:researcher", "system:approval", "tg:123"])
def test_gateway_only_types_refused_to_others(client_id, message_type, topic):
    """No peer but the gateway may send a gateway-only type, anywhere."""
    assert not grants_of(client_id).may_send(message_type, topic)


SUBSCRIBE_CASES = [
    ("tg:123", "tg:123", True),
    ("tg:123", "tg:456", False),
    ("tg:123", "tg:*", False),
    ("agent:system", "system:spawn", True),
    ("agent:system", "system:route", True),
    ("agent:system", "agent:system", True),
    ("agent:system", "system:*", False),
    ("agent:worker", "agent:worker", True),
    ("agent:worker", "agent:main", False),
    ("agent:worker", "agent:*", False),
    ("agent:main", "agent:main", True),
    ("agent:main", "agent:researcher", False),
    ("agent:researcher", "agent:researcher", True),
    ("agent:researcher", "agent:main", False),
    ("system:gateway", "bcp:*", True),
    ("system:gateway", "bcp:main:researcher", True),
    ("system:gateway", "bcp:*:researcher", True),
    ("system:gateway", "system:presence", True),
    ("system:gateway", "system:approval", True),
    ("system:gateway", "agent:main", False),
    ("system:gateway", "*", False),
    ("human:alice", "system:approval", True),
    ("human:alice", "system:presence", False),
    ("system:gateway", "system:gateway", True),
    ("system:screener-x", "system:screener-x", True),
    ("system:screener-x", "system:approval", False),
    ("system:screener-x", "system:*", False),
    ("agent:main", "system:screener-x", False),
    ("human:alice", "system:screener-x", False),
    ("agent:system", "system:screener-x", False),
]


@pytest.mark.parametrize(("client_id", "pattern", "allowed"), SUBSCRIBE_CASES)
def test_may_subscribe_default(client_id, pattern, allowed):
    """The default policy grants exactly the seed matrix and the BCP roles' subscriptions."""
    assert grants_of(client_id).may_subscribe(pattern) is allowed


@pytest.mark.parametrize("client_id", NON_GATEWAY)
@pytest.mark.parametrize(
    "pattern",
    ["bcp:*", "bcp:main:researcher", "bcp:main:*", "bcp:*:researcher", "*", "*:main:researcher"],
)
def test_only_gateway_reads_bcp(client_id, pattern):
    """No peer but the gateway may subscribe to anything matching a bcp: topic."""
    assert not grants_of(client_id).may_subscribe(pattern)


@pytest.mark.parametrize("client_id", NON_GATEWAY)
def test_only_gateway_sees_presence(client_id):
    """Presence events go to the gateway only."""
    assert not grants_of(client_id).may_subscribe("system:presence")


@pytest.mark.parametrize(
    ("client_id", "topics"),
    [
        ("tg:123", ("tg:123",)),
        ("agent:main", ("agent:main",)),
        ("system:gateway", ("bcp:*", "system:presence", "system:approval", "system:gateway")),
        ("system:screener-x", ("system:screener-x",)),
    ],
)
def test_subscribe_patterns_substitute_name(client_id, topics):
    """The patterns listed for capabilities.topics have {name} replaced by the peer's name."""
    assert grants_of(client_id).subscribe_patterns == topics


def test_default_declassifier_is_gateway_only():
    """Only system:gateway is a declassifier in the default policy."""
    assert [name for name, role in DEFAULT.roles.items() if role.declassifier] == ["gateway"]
    assert [peer for peer in PEERS if grants_of(peer).declassifier] == ["system:gateway"]


def test_default_roles_are_documented():
    """Every role of the default policy carries a description."""
    assert all(role.description for role in DEFAULT.roles.values())


def test_default_is_the_packaged_file():
    """Policy.default() reads bus/default_policy.yaml, and reads it once."""
    path = Path(__file__).parents[2] / "bus" / "default_policy.yaml"
    assert Policy.load(path).roles == DEFAULT.roles
    assert Policy.default() is DEFAULT


def test_repr_names_source_and_roles():
    """A policy's repr says where it came from and which roles it has."""
    assert repr(Policy.from_yaml(policy_text(), source="p.yaml")) == "<Policy p.yaml roles=['r']>"


def test_roles_view_is_read_only():
    """Policy.roles cannot be changed by its users."""
    with pytest.raises(TypeError):
        DEFAULT.roles["intruder"] = Role("intruder")  # type: ignore[index]


@pytest.mark.parametrize(
    ("client_id", "assigned", "taint", "expected"),
    [
        ("agent:researcher", ("reader",), None, "high"),
        ("agent:main", ("controller",), None, "none"),
        ("agent:main", ("controller",), "medium", "medium"),
        ("agent:researcher", ("reader",), "low", "high"),
        ("agent:main", ("controller", "reader"), None, "high"),
        ("system:gateway", (), None, "none"),
    ],
)
def test_grants_taint(client_id, assigned, taint, expected):
    """A peer's taint is the highest of its roles' and its definition's."""
    roles = DEFAULT.roles_for(client_id, assigned)
    assert DEFAULT.grants(client_id, roles, taint=taint).taint == expected


def test_no_roles_is_default_deny():
    """A peer with no roles may send nothing and subscribe to nothing."""
    grants = DEFAULT.grants("other:peer", DEFAULT.roles_for("other:peer"))
    assert grants.roles == frozenset()
    assert not grants.may_send("agent_event", "agent:main")
    assert not grants.may_subscribe("other:peer")
    assert grants.subscribe_patterns == ()


@pytest.mark.parametrize("topic", ["agent:*", "agent:", "agent::x", "", ":", "agent:a b", "*"])
def test_may_send_refuses_invalid_topics(topic):
    """A topic that is not a valid concrete topic is refused even under a wildcard grant."""
    assert not grants_of("tg:123").may_send("configure", topic)


@pytest.mark.parametrize("pattern", ["", "agent:", "agent::main", "agent:ma*", "agent:{name}"])
def test_may_subscribe_refuses_invalid_patterns(pattern):
    """A malformed subscription pattern is refused."""
    grants = Grants("x:y", subscribe_patterns=("*",))
    assert not grants.may_subscribe(pattern)


def test_may_send_cache_is_bounded():
    """may_send memoizes in a bounded cache and its answers stay right after eviction."""
    grants = grants_of("tg:123")
    for i in range(3000):
        assert grants.may_send("configure", f"agent:a{i}")
        assert not grants.may_send("configure", f"tg:a{i}")
    assert len(grants._cache) <= 1024
    assert grants.may_send("configure", "agent:a0")
    assert not grants.may_send("configure", "tg:a0")


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: DEFAULT.roles_for("agent:main", ["ghost"]), "ghost"),
        (lambda: DEFAULT.roles_for("agent:evil", ["gateway"]), "declassifier"),
        (lambda: DEFAULT.grants("agent:evil", ["gateway"]), "declassifier"),
        (lambda: DEFAULT.grants("agent:main", ["ghost"]), "ghost"),
    ],
)
def test_bad_assignment(call, error):
    """Assigning an undefined role, or the declassifier role to a non-member, is refused."""
    with pytest.raises(PolicyError, match=error):
        call()


@pytest.mark.parametrize(
    ("call", "exc"),
    [
        (lambda: DEFAULT.grants("agent", []), ValueError),
        (lambda: DEFAULT.grants("agent:a:b", []), ValueError),
        (lambda: DEFAULT.grants("agent:*", []), ValueError),
        (lambda: DEFAULT.grants("agent:main\n", []), ValueError),
        (lambda: DEFAULT.grants("agent:main", [], taint="extreme"), ValueError),  # type: ignore[arg-type]
        (lambda: DEFAULT.grants("agent:main", "agent"), TypeError),
        (lambda: DEFAULT.roles_for("agent:main", "agent"), TypeError),
        (lambda: Grants("x:y", subscribe_patterns=("a::b",)), ValueError),
        (lambda: Grants("x:y", send_patterns={"t": ("agent:{name}",)}), ValueError),
    ],
)
def test_bad_arguments(call, exc):
    """Malformed clientIds, taints, role lists and patterns are refused, never widened."""
    with pytest.raises(exc):
        call()


# Pattern coverage

SEGMENTS = ["a", "b", "*"]
patterns = st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=4).map(tuple)


def ref_match(pattern: tuple[str, ...], topic: tuple[str, ...]) -> bool:
    """Reference matcher straight from the spec, independent of the module's."""
    if pattern[-1] == "*":
        head = pattern[:-1]
        if len(topic) <= len(head):
            return False
        topic = topic[: len(head)]
        pattern = head
    elif len(topic) != len(pattern):
        return False
    return all(p in ("*", t) for p, t in zip(pattern, topic, strict=True))


@st.composite
def pattern_and_topic(draw: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A pattern and a topic it matches, each '*' filled with generated segments."""
    pattern = draw(patterns)
    literal = st.sampled_from(["a", "b", "c"])
    topic: list[str] = []
    for i, segment in enumerate(pattern):
        if segment != "*":
            topic.append(segment)
        elif i < len(pattern) - 1:
            topic.append(draw(literal))
        else:
            topic.extend(draw(st.lists(literal, min_size=1, max_size=3)))
    return pattern, tuple(topic)


@given(patterns, pattern_and_topic())
def test_covers_is_sound(granted, requested_and_topic):
    """If a grant covers a requested pattern, it matches every topic the requested one matches."""
    requested, topic = requested_and_topic
    assert ref_match(requested, topic)
    if _covers(granted, requested):
        assert ref_match(granted, topic)


@given(patterns, patterns)
def test_covers_is_complete(granted, requested):
    """If a grant does not cover a requested pattern, some topic proves it."""
    # Topics over the patterns' literals plus one fresh literal, up to one segment longer than
    # either pattern, contain a witness whenever one exists.
    longest = max(len(granted), len(requested)) + 1
    witness = any(
        ref_match(requested, topic) and not ref_match(granted, topic)
        for n in range(1, longest + 1)
        for topic in itertools.product(["a", "b", "z"], repeat=n)
    )
    assert _covers(granted, requested) is not witness


@given(pattern_and_topic(), st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=5))
def test_may_send_matches_like_the_spec(pattern_and_topic, other):
    """may_send's compiled patterns agree with the reference matcher."""
    pattern, topic = pattern_and_topic
    grants = Grants("x:y", send_patterns={"t": (":".join(pattern),)})
    assert grants.may_send("t", ":".join(topic))
    assert grants.may_send("t", ":".join(other)) is ref_match(pattern, tuple(other))


@pytest.mark.parametrize(
    ("granted", "requested", "covered"),
    [
        ("agent:*", "agent:main", True),
        ("agent:main", "agent:*", False),
        ("agent:main", "agent:main", True),
        ("*", "anything:at:all", True),
        ("*", "*", True),
        ("bcp:*", "bcp:*:researcher", True),
        ("bcp:*:researcher", "bcp:*", False),
        ("a:*:c", "a:b:c", True),
        ("a:*", "a:*:*", True),
        ("a:*:*", "a:*", False),
        ("a:*:c", "a:*", False),
        ("a:b", "a:b:c", False),
    ],
)
def test_covers_examples(granted, requested, covered):
    """Coverage on hand-picked patterns, through may_subscribe."""
    grants = Grants("x:y", subscribe_patterns=(granted,))
    assert grants.may_subscribe(requested) is covered


# Load-time errors

BASE_ROLE: dict[str, Any] = {
    "members": ["agent:*"],
    "send": [{"types": ["agent_event"], "topics": ["agent:*"]}],
    "subscribe": ["agent:{name}"],
}


def policy_text(**role: Any) -> str:
    """A one-role policy whose role `r` is BASE_ROLE updated with ``role``."""
    return yaml.safe_dump({"version": 1, "roles": {"r": {**BASE_ROLE, **role}}})


def send(types: list[Any], topics: list[Any]) -> list[dict[str, Any]]:
    return [{"types": types, "topics": topics}]


GATEWAY = {"members": ["system:gateway"], "declassifier": True, "send": [], "subscribe": []}

ERROR_CASES: list[tuple[str, str]] = [
    ("", "test.yaml: the policy is empty"),
    ("# nothing but a comment\n", "test.yaml: the policy is empty"),
    ("[1, 2]", "test.yaml: the top level must be a mapping"),
    ("version: 1\nroles: [", "test.yaml: not valid YAML"),
    ("version: 1", "test.yaml: roles: required"),
    ("version: 1\nroles: {}", "test.yaml: roles: required"),
    ("version: 1\nroles: [r]", "test.yaml: roles: required"),
    ("roles: {r: {}}", "test.yaml: version: required"),
    ("version: 2\nroles: {r: {}}", "test.yaml: version: 2 is not supported"),
    ("version: '1'\nroles: {r: {}}", "test.yaml: version: '1' is not supported"),
    ("version: 1.0\nroles: {r: {}}", "test.yaml: version: 1.0 is not supported"),
    ("version: true\nroles: {r: {}}", "test.yaml: version: True is not supported"),
    ("version: 1\nrolse: {}\nroles: {r: {}}", "test.yaml: rolse: unknown key"),
    ("version: 1\nroles:\n  r: {}\n  r: {}\n", "duplicate key 'r'"),
    ("version: 1\nroles: {[a]: {}}", "test.yaml: not valid YAML"),
    ("version: 1\nroles: {1: {}}", "test.yaml: roles: role name 1 must be a string"),
    ("version: 1\nroles: {Reader: {}}", "test.yaml: roles: bad role name 'Reader'"),
    ("version: 1\nroles: {r: }", "test.yaml: roles.r: expected a mapping"),
    ("version: 1\nroles: {r: [a]}", "test.yaml: roles.r: expected a mapping"),
    (policy_text(subscibe=[]), "test.yaml: roles.r.subscibe: unknown key"),
    (policy_text(description=5), "test.yaml: roles.r.description: expected a string"),
    (policy_text(members="agent:*"), "test.yaml: roles.r.members: expected a list"),
    (policy_text(members=None), "test.yaml: roles.r.members: expected a list"),
    (policy_text(members=[5]), "test.yaml: roles.r.members[0]: expected a string"),
    (policy_text(members=["agent"]), "test.yaml: roles.r.members[0]: 'agent' is neither"),
    (policy_text(members=["agent:x", "*"]), "test.yaml: roles.r.members[1]: '*' is neither"),
    (policy_text(members=["agent:{name}"]), "test.yaml: roles.r.members[0]"),
    (policy_text(members=["agent:ma*"]), "test.yaml: roles.r.members[0]"),
    (policy_text(members=["Agent:*"]), "test.yaml: roles.r.members[0]"),
    (policy_text(taint="extreme"), "test.yaml: roles.r.taint: 'extreme' is not one of"),
    (policy_text(declassifier="yes please"), "test.yaml: roles.r.declassifier: expected true"),
    (policy_text(send={"types": []}), "test.yaml: roles.r.send: expected a list"),
    (policy_text(send=["agent_event"]), "test.yaml: roles.r.send[0]: expected a mapping"),
    (policy_text(send=[{"types": ["a"]}]), "test.yaml: roles.r.send[0].topics: required"),
    (policy_text(send=[{"topics": ["a"]}]), "test.yaml: roles.r.send[0].types: required"),
    (
        policy_text(send=[{"types": ["a"], "topics": ["a"], "topic": ["b"]}]),
        "test.yaml: roles.r.send[0].topic: unknown key",
    ),
    (policy_text(send=send([], ["agent:*"])), "test.yaml: roles.r.send[0].types: empty"),
    (policy_text(send=send(["a"], [])), "test.yaml: roles.r.send[0].topics: empty"),
    (
        policy_text(send=[{"types": "a", "topics": ["a"]}]),
        "test.yaml: roles.r.send[0].types: expected a list",
    ),
    (policy_text(send=send(["Bad-Type"], ["a"])), "test.yaml: roles.r.send[0].types[0]: 'Bad-"),
    (policy_text(send=send(["a"], ["x", "agent::x"])), "test.yaml: roles.r.send[0].topics[1]"),
    (policy_text(send=send(["a"], [""])), "test.yaml: roles.r.send[0].topics[0]: a pattern"),
    (policy_text(send=send(["a"], ["a" * 257])), "test.yaml: roles.r.send[0].topics[0]"),
    (policy_text(send=send(["a"], ["agent:ma*"])), "'*' must be a whole segment"),
    (policy_text(send=send(["a"], ["agent:{id}"])), "unknown placeholder {id}"),
    (policy_text(send=send(["a"], ["agent:{NAME}"])), "unknown placeholder {NAME}"),
    (policy_text(send=send(["a"], ["agent:x{name}"])), "{name} must be a whole segment"),
    (policy_text(send=send(["a"], ["agent:{name"])), "segments are ':'-separated"),
    (policy_text(send=send(["a"], ["agent: x"])), "segments are ':'-separated"),
    (policy_text(subscribe=["agent:{who}"]), "test.yaml: roles.r.subscribe[0]: unknown placeh"),
    (policy_text(subscribe=["ok", ""]), "test.yaml: roles.r.subscribe[1]: a pattern"),
    # Hard rules
    (policy_text(subscribe=["bcp:*"]), "test.yaml: roles.r.subscribe[0]: 'bcp:*' could match"),
    (policy_text(subscribe=["bcp:main:researcher"]), "roles.r.subscribe[0]: 'bcp:main:re"),
    (policy_text(subscribe=["*"]), "test.yaml: roles.r.subscribe[0]: '*' could match bcp"),
    (policy_text(subscribe=["*:main:researcher"]), "roles.r.subscribe[0]: '*:main:researcher'"),
    (policy_text(subscribe=["{name}:*"]), "roles.r.subscribe[0]: '{name}:*' could match bcp"),
    (
        yaml.safe_dump({"version": 1, "roles": {"g": GATEWAY, "h": GATEWAY}}),
        "test.yaml: roles.h.declassifier: only one role may be a declassifier, and g already is",
    ),
    (
        yaml.safe_dump({"version": 1, "roles": {"g": {**GATEWAY, "members": ["system:*"]}}}),
        "test.yaml: roles.g.members[0]: a declassifier role lists exact clientIds only",
    ),
    (
        yaml.safe_dump({"version": 1, "roles": {"g": {**GATEWAY, "members": []}}}),
        "test.yaml: roles.g.members: a declassifier role needs a member",
    ),
]


@pytest.mark.parametrize(("text", "error"), ERROR_CASES)
def test_policy_errors(text, error):
    """Every malformed policy fails to load with a message naming the source and field."""
    with pytest.raises(PolicyError) as caught:
        Policy.from_yaml(text, source="test.yaml")
    assert str(caught.value).startswith("test.yaml: ")
    assert error in str(caught.value)


@pytest.mark.parametrize("message_type", sorted(GATEWAY_ONLY_TYPES))
def test_gateway_only_types_need_declassifier(message_type):
    """No policy may grant a gateway-only type to a role that is not the declassifier."""
    text = policy_text(send=send(["agent_event", message_type], ["agent:*"]))
    with pytest.raises(PolicyError, match=r"roles\.r\.send\[0\]\.types\[1\]: .* declassifier"):
        Policy.from_yaml(text, source="test.yaml")


def test_declassifier_may_read_bcp():
    """The declassifier role may be granted gateway-only types and bcp: subscriptions."""
    role = {
        **GATEWAY,
        "send": send(sorted(GATEWAY_ONLY_TYPES), ["agent:*"]),
        "subscribe": ["bcp:*", "*"],
    }
    policy = Policy.from_yaml(yaml.safe_dump({"version": 1, "roles": {"g": role}}))
    grants = policy.grants("system:gateway", policy.roles_for("system:gateway"))
    assert grants.may_subscribe("bcp:main:researcher")
    assert grants.may_send("bcp_query", "agent:researcher")


@pytest.mark.parametrize(
    ("roles", "error"),
    [
        ([], "<policy>: roles: no roles"),
        ([Role("r"), Role("r")], "<policy>: roles.r: defined twice"),
        ([Role("r", taint="extreme")], "<policy>: roles.r.taint"),  # type: ignore[arg-type]
        ([Role("r", send=(SendRule(("bcp_query",), ("agent:*",)),))], "send[0].types[0]"),
        ([Role("r", subscribe=("bcp:*",))], "roles.r.subscribe[0]"),
    ],
)
def test_policy_constructor_checks_roles(roles, error):
    """Roles built in code meet the same rules as roles read from YAML."""
    with pytest.raises(PolicyError, match=error.replace("[", r"\[").replace("]", r"\]")):
        Policy(roles)


def test_load_missing_file(tmp_path):
    """A missing policy file stops the bus: PolicyError naming the file."""
    path = tmp_path / "nope.yaml"
    with pytest.raises(PolicyError, match=f"^{path}: cannot read the policy"):
        Policy.load(path)


def test_load_not_utf8(tmp_path):
    """A policy file that is not UTF-8 fails with PolicyError naming the file."""
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"version: 1\nroles: {r: {description: \xff}}\n")
    with pytest.raises(PolicyError, match="policy.yaml: cannot read"):
        Policy.load(path)


def test_load_errors_name_the_file(tmp_path):
    """Errors in a loaded file start with the file's path."""
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text(taint="extreme"))
    with pytest.raises(PolicyError, match=f"^{path}: roles.r.taint"):
        Policy.load(os.fspath(path))


def test_minimal_role():
    """A role with only members is valid and grants nothing."""
    policy = Policy.from_yaml("version: 1\nroles:\n  r: {members: ['agent:*']}\n")
    grants = policy.grants("agent:x", policy.roles_for("agent:x"))
    assert grants.roles == {"r"}
    assert grants.send_patterns == {}
    assert not grants.may_send("agent_event", "agent:x")


def test_duplicate_sends_merge():
    """Patterns granted by several roles are listed once, in policy order."""
    text = yaml.safe_dump(
        {
            "version": 1,
            "roles": {
                "a": {"members": ["agent:*"], "subscribe": ["agent:{name}", "system:x"]},
                "b": {
                    "members": ["agent:*"],
                    "send": send(["t"], ["agent:*", "tg:*"]),
                    "subscribe": ["agent:{name}"],
                },
                "c": {"members": ["agent:x"], "send": send(["t"], ["tg:*"])},
            },
        }
    )
    policy = Policy.from_yaml(text)
    grants = policy.grants("agent:x", policy.roles_for("agent:x"))
    assert grants.subscribe_patterns == ("agent:x", "system:x")
    assert grants.send_patterns == {"t": ("agent:*", "tg:*")}


# The taint rule

LEVELS = list(TAINT_LEVELS)


@pytest.mark.parametrize(
    ("sender", "target", "allowed"),
    [
        (Grants("agent:r", taint="high"), Grants("agent:c", taint="none"), False),
        (Grants("agent:r", taint="high"), Grants("agent:c", taint="medium"), False),
        (Grants("agent:r", taint="high"), Grants("agent:s", taint="high"), True),
        (Grants("agent:c", taint="none"), Grants("agent:r", taint="high"), True),
        (Grants("agent:c", taint="none"), Grants("agent:d", taint="none"), True),
        (Grants("agent:r", taint="high"), Grants("system:g", declassifier=True), True),
        (Grants("system:g", declassifier=True), Grants("agent:c", taint="none"), True),
        (Grants("system:g", taint="high", declassifier=True), Grants("agent:c"), True),
    ],
)
def test_may_flow(sender, target, allowed):
    """Messages never flow down in taint except to or from the declassifier."""
    assert may_flow(sender, target) is allowed


@given(st.sampled_from(LEVELS), st.sampled_from(LEVELS))
def test_may_flow_is_no_write_down(sender_taint, target_taint):
    """Between ordinary peers a message flows iff the target is at least as tainted."""
    sender = Grants("agent:a", taint=sender_taint)
    target = Grants("agent:b", taint=target_taint)
    expected = LEVELS.index(sender_taint) <= LEVELS.index(target_taint)
    assert may_flow(sender, target) is expected


def test_default_reader_cannot_reach_controller():
    """In the default policy, a reader's messages reach a controller only via the gateway."""
    reader, controller, gateway = (
        grants_of(p) for p in ("agent:researcher", "agent:main", "system:gateway")
    )
    assert not may_flow(reader, controller)
    assert not may_flow(reader, grants_of("tg:123"))
    assert may_flow(reader, gateway)
    assert may_flow(gateway, controller)
    assert may_flow(controller, reader)


def test_default_screener_is_tainted_and_reaches_the_gateway_only():
    """A screener is tainted high: its messages reach the gateway, never a controller."""
    screener, controller, gateway = (
        grants_of(p) for p in ("system:screener-x", "agent:main", "system:gateway")
    )
    assert screener.taint == "high" and not screener.declassifier
    assert may_flow(screener, gateway)
    assert not may_flow(screener, controller)
    assert not may_flow(screener, grants_of("human:alice"))


@pytest.mark.parametrize("client_id", list(PEERS))
def test_raw_text_reaches_only_peers_tainted_high(client_id):
    """A bcp_screen_request, even from the declassifier, goes to high-taint peers only."""
    gateway, target = grants_of("system:gateway"), grants_of(client_id)
    allowed = target.taint == "high"
    assert may_flow(gateway, target, "bcp_screen_request") is allowed
    assert may_flow(gateway, target) is True
    assert may_flow(gateway, Grants("x:y", taint="medium"), "bcp_screen_request") is False


def test_the_file_shape_covers_every_role_field():
    """Every field of Role but its name is a key a policy file may write, and no other."""
    assert set(_RoleFile.model_fields) == {f.name for f in fields(Role)} - {"name"}
