"""Topic validation, pattern matching, and the subscription index."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from bus.core.errors import InvalidParams
from bus.core.topics import SubscriptionIndex, matches, validate_pattern, validate_topic


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("bcp:main:researcher", "bcp:main:researcher", True),
        ("bcp:*", "bcp:main:researcher", True),
        ("bcp:*", "bcp:main", True),
        ("bcp:*", "bcp", False),
        ("bcp:*:researcher", "bcp:main:researcher", True),
        ("bcp:*:researcher", "bcp:main:other", False),
        ("bcp:*:researcher", "bcp:a:b:researcher", False),
        ("*", "anything:at:all", True),
        ("agent:main", "agent:main:x", False),
        ("agent:*:*", "agent:a", False),
        ("agent:*:*", "agent:a:b:c", True),
    ],
)
def test_matches(pattern, topic, expected):
    """A middle '*' is one segment; a trailing '*' is one or more."""
    assert matches(pattern, topic) is expected


@pytest.mark.parametrize("topic", ["", "a::b", ":a", "a:", "a:*", "a b", "a:\x00", "x" * 300])
def test_invalid_topics(topic):
    """Empty segments, '*', spaces, control characters and overlong topics are refused."""
    with pytest.raises(InvalidParams):
        validate_topic(topic)


@pytest.mark.parametrize("pattern", ["a:b*", "a::*", "", "a:{name}"])
def test_invalid_patterns(pattern):
    """Partial-segment wildcards, empty segments and braces are refused."""
    with pytest.raises(InvalidParams):
        validate_pattern(pattern)


def test_valid_topic_and_pattern_pass():
    """Ordinary names pass unchanged."""
    assert validate_topic("bcp:main:researcher") == "bcp:main:researcher"
    assert validate_pattern("bcp:*:researcher") == "bcp:*:researcher"


def test_index_returns_each_key_once():
    """A key whose several patterns match is returned once."""
    index: SubscriptionIndex[str] = SubscriptionIndex()
    for pattern in ("bcp:*", "bcp:main:researcher", "bcp:*:researcher", "*"):
        assert index.add(pattern, "gw")
    assert not index.add("bcp:*", "gw")
    assert index.match("bcp:main:researcher") == {"gw"}
    assert len(index) == 4


def test_index_discard():
    """Discarded patterns stop matching; discarding twice reports False."""
    index: SubscriptionIndex[str] = SubscriptionIndex()
    index.add("a:*", "x")
    index.add("a:b", "y")
    assert index.discard("a:*", "x") and not index.discard("a:*", "x")
    assert index.discard("a:b", "y") and not index.discard("a:b", "y")
    assert not index.discard("q:*:r", "x")
    assert index.match("a:b") == set()
    assert len(index) == 0


segment = st.sampled_from(["a", "b", "c"])
topics = st.lists(segment, min_size=1, max_size=4).map(":".join)
patterns = st.lists(st.sampled_from(["a", "b", "c", "*"]), min_size=1, max_size=4).map(":".join)


@given(st.lists(st.tuples(patterns, st.integers(0, 5)), max_size=20), topics)
def test_index_agrees_with_matches(subs, topic):
    """The index finds exactly the keys a scan with matches() finds."""
    index: SubscriptionIndex[int] = SubscriptionIndex()
    for pattern, key in subs:
        index.add(pattern, key)
    expected = {key for pattern, key in subs if matches(pattern, topic)}
    assert index.match(topic) == expected
