"""Topic names, subscription patterns, and the index that finds a topic's subscribers.

A topic is ``:``-separated non-empty segments (``bcp:main:researcher``). A pattern is a topic
that may have ``*`` segments: a ``*`` in the middle matches exactly one segment, a trailing ``*``
matches one or more (``bcp:*`` matches ``bcp:main:researcher``). Publishing to a topic that
contains ``*`` is invalid.

:class:`SubscriptionIndex` answers "who subscribes to this topic?" without scanning every
subscription: exact patterns sit in a dict, wildcard patterns in a trie walked segment by segment,
so the cost of a lookup grows with the topic's length, not with the number of patterns.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Generic, TypeVar

from .errors import InvalidParams

__all__ = [
    "LITERAL_SEGMENT",
    "MAX_TOPIC_LENGTH",
    "PATTERN_RE",
    "SEGMENT_RE",
    "TOPIC_RE",
    "SubscriptionIndex",
    "matches",
    "validate_pattern",
    "validate_topic",
]

# The one grammar of topics and patterns; bus.core.policy reads its patterns with it too.
MAX_TOPIC_LENGTH = 256
"""The longest topic or pattern, in characters."""
LITERAL_SEGMENT = r"[A-Za-z0-9._-]+"
"""One segment of a concrete topic."""
SEGMENT_RE = re.compile(LITERAL_SEGMENT)
TOPIC_RE = re.compile(rf"{LITERAL_SEGMENT}(?::{LITERAL_SEGMENT})*")
"""A whole concrete topic (check its length apart)."""
PATTERN_RE = re.compile(rf"(?:{LITERAL_SEGMENT}|\*)(?::(?:{LITERAL_SEGMENT}|\*))*")
"""A whole subscription pattern: concrete segments or whole ``*`` ones."""
_PATTERN_SEGMENT = re.compile(rf"{LITERAL_SEGMENT}|\*")

K = TypeVar("K", bound=Hashable)


def validate_topic(topic: str) -> str:
    """Return ``topic`` if it is a concrete topic one may publish to.

    Raises:
        InvalidParams: it is empty, too long, has an empty segment or a ``*``, or characters
            outside letters, digits, ``.``, ``_``, ``-``.
    """
    if "*" in topic:
        raise InvalidParams(f"cannot publish to {topic!r}: '*' is only for subscription patterns")
    _check(topic, SEGMENT_RE, "topic")
    return topic


def validate_pattern(pattern: str) -> str:
    """Return ``pattern`` if it is a valid subscription pattern.

    Raises:
        InvalidParams: as for :func:`validate_topic`, except that whole ``*`` segments are allowed.
    """
    _check(pattern, _PATTERN_SEGMENT, "pattern")
    return pattern


def _check(text: str, segment: re.Pattern[str], what: str) -> None:
    if not text or len(text) > MAX_TOPIC_LENGTH:
        raise InvalidParams(f"invalid {what}: must be 1 to {MAX_TOPIC_LENGTH} characters")
    for part in text.split(":"):
        if not segment.fullmatch(part):
            raise InvalidParams(
                f"invalid {what} {text!r}: segments are ':'-separated, non-empty, and use "
                "letters, digits, '.', '_', '-'" + (" or a whole '*'" if what == "pattern" else "")
            )


def matches(pattern: str, topic: str) -> bool:
    """Return whether ``pattern`` matches the concrete ``topic``.

    A middle ``*`` matches exactly one segment; a trailing ``*`` matches one or more.
    """
    want = pattern.split(":")
    have = topic.split(":")
    last = len(want) - 1
    for i, seg in enumerate(want):
        if i >= len(have):
            return False
        if seg == "*":
            if i == last:
                return True
            continue
        if seg != have[i]:
            return False
    return len(have) == len(want)


class _Node(Generic[K]):
    __slots__ = ("children", "ends", "tails")

    def __init__(self) -> None:
        self.children: dict[str, _Node[K]] = {}
        # Keys whose pattern ends exactly at this node.
        self.ends: set[K] = set()
        # Keys whose pattern continues with a trailing '*': one or more further segments.
        self.tails: set[K] = set()


class SubscriptionIndex(Generic[K]):
    """Map patterns to subscriber keys, and topics to the keys whose patterns match them.

    A key (a connection, say) appears once in a :meth:`match` result however many of its
    patterns match. The index holds plain keys; remove a departing subscriber with
    :meth:`discard` for each of its patterns.
    """

    def __init__(self) -> None:
        self._exact: dict[str, set[K]] = {}
        self._root: _Node[K] = _Node()
        self._wildcards = 0

    def __len__(self) -> int:
        """Return the number of (pattern, key) pairs, exact and wildcard."""
        return sum(len(keys) for keys in self._exact.values()) + self._wildcards

    def add(self, pattern: str, key: K) -> bool:
        """Subscribe ``key`` to ``pattern``; return False if it already was."""
        if "*" not in pattern:
            keys = self._exact.setdefault(pattern, set())
            if key in keys:
                return False
            keys.add(key)
            return True
        bucket = self._bucket(pattern, create=True)
        assert bucket is not None
        if key in bucket:
            return False
        bucket.add(key)
        self._wildcards += 1
        return True

    def discard(self, pattern: str, key: K) -> bool:
        """Unsubscribe ``key`` from ``pattern``; return False if it was not subscribed."""
        if "*" not in pattern:
            keys = self._exact.get(pattern)
            if keys is None or key not in keys:
                return False
            keys.discard(key)
            if not keys:
                del self._exact[pattern]
            return True
        bucket = self._bucket(pattern, create=False)
        if bucket is None or key not in bucket:
            return False
        bucket.discard(key)
        self._wildcards -= 1
        # Empty trie nodes are left in place: they are cheap and patterns tend to come back.
        return True

    def match(self, topic: str) -> set[K]:
        """Return every key with at least one pattern matching ``topic``."""
        found: set[K] = set()
        exact = self._exact.get(topic)
        if exact:
            found.update(exact)
        if self._wildcards:
            self._walk(self._root, topic.split(":"), 0, found)
        return found

    def _walk(self, node: _Node[K], segments: list[str], i: int, found: set[K]) -> None:
        if i == len(segments):
            found.update(node.ends)
            return
        # A trailing '*' here matches segments[i:], which is one or more segments.
        found.update(node.tails)
        for name in (segments[i], "*"):
            child = node.children.get(name)
            if child is not None:
                self._walk(child, segments, i + 1, found)

    def _bucket(self, pattern: str, *, create: bool) -> set[K] | None:
        segments = pattern.split(":")
        node = self._root
        for seg in segments[:-1]:
            child = node.children.get(seg)
            if child is None:
                if not create:
                    return None
                child = node.children[seg] = _Node()
            node = child
        last = segments[-1]
        if last == "*":
            return node.tails
        child = node.children.get(last)
        if child is None:
            if not create:
                return None
            child = node.children[last] = _Node()
        return child.ends
