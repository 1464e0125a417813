"""The authorization policy: which peer may send which message types to which topics, and
subscribe to which patterns.

One :class:`Policy` is loaded from YAML when the bus starts and is in force on every request.
Everything is denied unless a rule grants it. When a peer authenticates, the server asks the
policy for the peer's roles (:meth:`Policy.roles_for`) and computes its :class:`Grants` once
(:meth:`Policy.grants`); every ``sendMessage`` and ``subscribe`` is then checked against those
grants, and every delivery against :func:`may_flow`.

The file format (``version`` and ``roles`` are required, and no other key is accepted anywhere,
so a typo fails loudly instead of silently widening or narrowing a grant):

.. code-block:: yaml

    version: 1
    roles:
      reader:                          # role name: lowercase letters, digits, '_', '-'
        description: free text         # optional
        members: ["agent:*"]           # clientIds that hold the role: exact, or `prefix:*`
        taint: high                    # optional: none | low | medium | high
        declassifier: false            # optional: true only for the gateway's role
        admin: false                   # optional: may ask the bus who is connected (listPeers)
        send:                          # optional: rules, each a list of types and of topics
          - types: [bcp_response]
            topics: ["bcp:*:{name}"]
        subscribe: ["agent:{name}"]    # optional: patterns the peer may subscribe to

A peer holds a role when one of the role's ``members`` patterns matches its clientId, or when
the role is assigned to it (by the peers file or by its agent definition). ``{name}`` in a
topic or subscribe pattern stands for the peer's own name, the part of its clientId after the
first ``:`` (``researcher`` for ``agent:researcher``); it must be a whole segment.

Topic patterns follow the bus's topic rules: ``:``-separated non-empty segments of letters,
digits, ``.``, ``_``, ``-``, where a ``*`` segment in the middle matches exactly one segment
and a trailing ``*`` matches one or more.

Hard rules that no policy file can override, checked when it loads:

- only a role with ``declassifier: true`` may send :data:`GATEWAY_ONLY_TYPES` or subscribe to a
  pattern that could match a ``bcp:`` topic (first segment ``bcp``, ``*`` or ``{name}``);
- at most one role is a declassifier, its members are exact clientIds, and it can be held
  only by those members, never assigned to anyone else.

Every load-time error is a :class:`PolicyError` whose message names the source and the YAML
path of the bad field, e.g. ``policy.yaml: roles.reader.send[0].topics[0]: ...``.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Final

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    model_validator,
)

from schemas import strict_yaml
from schemas.bus import CLIENT_ID_PATTERN, ROLE_NAME_PATTERN
from schemas.common import TAINT_LEVELS, TaintLevel, taint_rank

from .topics import MAX_TOPIC_LENGTH, PATTERN_RE, SEGMENT_RE, TOPIC_RE

__all__ = [
    "GATEWAY_ONLY_TYPES",
    "POLICY_VERSION",
    "RAW_TEXT_TYPES",
    "Grants",
    "Policy",
    "PolicyError",
    "Role",
    "SendRule",
    "flows",
    "may_flow",
]

POLICY_VERSION: Final = 1
"""The only ``version`` this module reads."""

GATEWAY_ONLY_TYPES: Final[frozenset[str]] = frozenset(
    {
        "bcp_response_delivery",
        "bcp_validation_result",
        "bcp_query",
        "bcp_subscriptions_active",
        "bcp_query_failed",
        "bcp_approval_request",
        "bcp_screen_request",
    }
)
"""Message types only a declassifier role may send: whoever sends them speaks for the gateway."""

RAW_TEXT_TYPES: Final[frozenset[str]] = frozenset({"bcp_screen_request"})
"""Message types that carry a tainted reader's raw text (the gateway's requests to screeners):
delivered to peers tainted ``high`` only, even from the declassifier (see :func:`may_flow`)."""

_NAME = "{name}"
_ROLE_NAME = re.compile(ROLE_NAME_PATTERN)
_TYPE_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")  # as the payload envelope's `type`
_PREFIX = re.compile(r"[a-z][a-z0-9_-]{0,31}")  # the clientId prefix, as in CLIENT_ID_PATTERN
_CLIENT_ID = re.compile(CLIENT_ID_PATTERN)
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
# Segments a non-declassifier may not put first in a subscribe pattern: each could match `bcp`
# (`{name}` too, since a peer could be called `agent:bcp`).
_BCP_READING_HEADS = frozenset({"bcp", "*", _NAME})
# Per connection, so it must stay small: 20,000 connections x 1,024 entries was gigabytes. A miss
# is two regex matches (under 1 us).
_CACHE_SIZE = 16


class PolicyError(ValueError):
    """The policy is unusable: unreadable, malformed, or breaking a hard rule.

    The message names the source and the YAML path of the bad field. At start-up, print it and
    refuse to serve: a broken policy must never fall back to allowing anything.
    """


@dataclass(frozen=True)
class SendRule:
    """One ``send`` entry: any of ``types`` may be sent to any topic matching ``topics``."""

    types: tuple[str, ...]
    topics: tuple[str, ...]


@dataclass(frozen=True)
class Role:
    """One role as written in the policy, patterns still holding ``{name}``."""

    name: str
    members: tuple[str, ...] = ()
    send: tuple[SendRule, ...] = ()
    subscribe: tuple[str, ...] = ()
    taint: TaintLevel | None = None
    declassifier: bool = False
    admin: bool = False
    """Holders may call the bus's operator methods (``listPeers``)."""
    description: str = ""


@dataclass(frozen=True, eq=False)
class Grants:
    """Everything one authenticated connection may do; build it with :meth:`Policy.grants`.

    Patterns here have ``{name}`` already replaced. Ask :meth:`may_send` before routing a
    ``sendMessage``, :meth:`may_subscribe` before adding a subscription, and :func:`may_flow`
    before each delivery.
    """

    client_id: str
    roles: frozenset[str] = frozenset()
    taint: TaintLevel = "none"
    declassifier: bool = False
    admin: bool = False
    """May call the bus's operator methods (``listPeers``)."""
    send_patterns: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Message type -> topic patterns it may be sent to."""
    subscribe_patterns: tuple[str, ...] = ()
    """The patterns this peer may subscribe to (or narrower ones); the ``initialize`` result
    lists them as ``capabilities.topics``."""
    _send: Mapping[str, re.Pattern[str]] = field(init=False, repr=False)
    _subscribe: tuple[tuple[str, ...], ...] = field(init=False, repr=False)
    _cache: dict[tuple[str, str], bool] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for patterns in (*self.send_patterns.values(), self.subscribe_patterns):
            for pattern in patterns:
                if PATTERN_RE.fullmatch(pattern) is None:
                    raise ValueError(f"invalid topic pattern {pattern!r}")
        send = {
            type_: re.compile("|".join(f"(?:{_regex(p)})" for p in patterns))
            for type_, patterns in self.send_patterns.items()
            if patterns
        }
        object.__setattr__(self, "send_patterns", MappingProxyType(dict(self.send_patterns)))
        object.__setattr__(self, "_send", send)
        object.__setattr__(
            self, "_subscribe", tuple(tuple(p.split(":")) for p in self.subscribe_patterns)
        )
        object.__setattr__(self, "_cache", {})

    def may_send(self, message_type: str, topic: str) -> bool:
        """Return whether this peer may send ``message_type`` to the concrete ``topic``.

        A topic that is not a valid concrete topic (empty segment, ``*``) is always refused.
        Answers are memoized per connection in a small bounded cache: this runs on every
        ``sendMessage``.
        """
        key = (message_type, topic)
        allowed = self._cache.get(key)
        if allowed is None:
            regex = self._send.get(message_type)
            allowed = (
                regex is not None
                and TOPIC_RE.fullmatch(topic) is not None
                and regex.fullmatch(topic) is not None
            )
            if len(self._cache) >= _CACHE_SIZE:
                # Evict the oldest answer (dicts keep insertion order); a peer cycling through
                # many topics costs itself a recompute, never unbounded memory.
                del self._cache[next(iter(self._cache))]
            self._cache[key] = allowed
        return allowed

    def may_subscribe(self, pattern: str) -> bool:
        """Return whether this peer may subscribe to ``pattern``.

        Allowed iff one granted pattern covers it: every topic ``pattern`` matches is matched by
        the granted one. So ``agent:main`` is fine under a grant of ``agent:*``, but ``agent:*``
        is refused to a peer granted only ``agent:main``. A malformed pattern is refused.
        """
        if PATTERN_RE.fullmatch(pattern) is None:
            return False
        requested = pattern.split(":")
        return any(_covers(granted, requested) for granted in self._subscribe)


def may_flow(sender: Grants, target: Grants, message_type: str | None = None) -> bool:
    """Return whether a message from ``sender`` may be delivered to ``target`` (no write-down).

    A message may go to a peer at least as tainted as its sender. The declassifier (the
    gateway) is exempt on both ends: it must receive tainted readers' answers, and it is the
    only one that may deliver to untainted peers, after validation. Refuse and log otherwise.

    A message of one of :data:`RAW_TEXT_TYPES` goes to peers tainted ``high`` only, whoever
    sends it: it carries what a reader wrote before validation, which the gateway passes to its
    screeners and to nobody else.
    """
    return flows(sender.taint, sender.declassifier, target, message_type)


def flows(
    taint: TaintLevel, declassifier: bool, target: Grants, message_type: str | None = None
) -> bool:
    """:func:`may_flow` from a sender known only by its taint and whether it was the
    declassifier, as the activity log keeps them with each message (see :mod:`bus.log.fetch`)."""
    if message_type in RAW_TEXT_TYPES and target.taint != "high":
        return False
    return declassifier or target.declassifier or taint_rank(taint) <= taint_rank(target.taint)


class Policy:
    """The roles in force; build one with :meth:`from_yaml`, :meth:`load` or :meth:`default`.

    Args:
        roles: the roles, checked here against every pattern rule and hard rule.
        source: the file name used in error messages.

    Raises:
        PolicyError: a role is invalid or breaks a hard rule.
    """

    def __init__(self, roles: Iterable[Role], *, source: str = "<policy>") -> None:
        self.source = source
        """Where the policy came from; error messages start with it."""
        by_name: dict[str, Role] = {}
        for role in roles:
            if role.name in by_name:
                raise _error(source, f"roles.{role.name}", "defined twice")
            _validate_role(role, source)
            by_name[role.name] = role
        if not by_name:
            raise _error(source, "roles", "no roles: the bus would refuse everything")
        _check_declassifiers(by_name.values(), source)
        self._roles = by_name
        self._view = MappingProxyType(by_name)
        self._exact: dict[str, set[str]] = {}
        self._prefix: dict[str, set[str]] = {}
        for role in by_name.values():
            for member in role.members:
                prefix, _, name = member.partition(":")
                table, key = (self._prefix, prefix) if name == "*" else (self._exact, member)
                table.setdefault(key, set()).add(role.name)

    @property
    def roles(self) -> Mapping[str, Role]:
        """The roles by name (a read-only view)."""
        return self._view

    def __repr__(self) -> str:
        return f"<Policy {self.source} roles={sorted(self._roles)}>"

    @classmethod
    def from_yaml(cls, text: str, *, source: str = "<string>") -> Policy:
        """Parse a policy from YAML text.

        Raises:
            PolicyError: the text is empty, not YAML, or has a missing, unknown or bad field;
                the message names ``source`` and the field's path.
        """
        try:
            shape = strict_yaml.load_model(_PolicyFile, text, source=source)
        except strict_yaml.LoadError as exc:
            raise PolicyError(str(exc)) from exc
        return cls((body.to_role(name) for name, body in shape.roles.items()), source=source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Policy:
        """Read a policy file.

        Raises:
            PolicyError: the file cannot be read or is not a valid policy.
        """
        source = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyError(f"{source}: cannot read the policy: {exc}") from exc
        return cls.from_yaml(text, source=source)

    @classmethod
    def default(cls) -> Policy:
        """Return the policy shipped as ``bus/default_policy.yaml``."""
        return _default()

    def roles_for(self, client_id: str, assigned: Iterable[str] = ()) -> frozenset[str]:
        """Return the roles ``client_id`` holds: those whose members match it, plus ``assigned``.

        Args:
            client_id: the authenticated clientId.
            assigned: roles given by the peers file or the peer's agent definition.

        Raises:
            PolicyError: an assigned role is not defined, or is a declassifier role assigned to
                a clientId that is not among its members. Refuse the connection.
        """
        held = set(self._exact.get(client_id, ()))
        prefix, sep, _ = client_id.partition(":")
        if sep:
            held.update(self._prefix.get(prefix, ()))
        held.update(self._known(client_id, assigned))
        return frozenset(held)

    def grants(
        self, client_id: str, roles: Iterable[str], *, taint: TaintLevel | None = None
    ) -> Grants:
        """Compute what one connection may do; call once per authenticated connection.

        Args:
            client_id: the authenticated clientId; its name part replaces ``{name}``.
            roles: the roles it holds, usually :meth:`roles_for`'s answer.
            taint: the taint from the peer's agent definition, if it has one. The roles'
                highest taint is a floor: a definition may raise a peer's taint, never lower it.

        Raises:
            ValueError: ``client_id`` is not a valid clientId or ``taint`` is not a level.
            PolicyError: as for :meth:`roles_for`.
        """
        if _CLIENT_ID.fullmatch(client_id) is None:
            raise ValueError(f"invalid clientId {client_id!r}")
        if taint is not None and taint not in TAINT_LEVELS:
            raise ValueError(f"invalid taint {taint!r}; expected one of {TAINT_LEVELS}")
        held = [self._roles[r] for r in sorted(set(self._known(client_id, roles)))]
        name = client_id.partition(":")[2]
        # dicts, not sets: they drop duplicates and keep the policy's order.
        send: dict[str, dict[str, None]] = {}
        subscribe: dict[str, None] = {}
        levels: list[TaintLevel] = [taint or "none"]
        for role in held:
            for rule in role.send:
                for type_ in rule.types:
                    send.setdefault(type_, {}).update(
                        dict.fromkeys(_fill(p, name) for p in rule.topics)
                    )
            subscribe.update(dict.fromkeys(_fill(p, name) for p in role.subscribe))
            if role.taint is not None:
                levels.append(role.taint)
        return Grants(
            client_id=client_id,
            roles=frozenset(role.name for role in held),
            taint=max(levels, key=taint_rank),
            declassifier=any(role.declassifier for role in held),
            admin=any(role.admin for role in held),
            send_patterns={t: tuple(ps) for t, ps in send.items()},
            subscribe_patterns=tuple(subscribe),
        )

    def _known(self, client_id: str, roles: Iterable[str]) -> list[str]:
        if isinstance(roles, str):
            raise TypeError("roles must be an iterable of role names, not one string")
        found = []
        for name in roles:
            role = self._roles.get(name)
            if role is None:
                raise PolicyError(
                    f"{self.source}: roles: {client_id} is assigned the role {name!r}, which "
                    f"this policy does not define; defined roles: {', '.join(sorted(self._roles))}"
                )
            if role.declassifier and client_id not in role.members:
                raise PolicyError(
                    f"{self.source}: roles.{name}.members: {client_id} is not a member of the "
                    "declassifier role, and it cannot be assigned to anyone else"
                )
            found.append(name)
        return found


@functools.cache
def _default() -> Policy:
    text = resources.files("bus").joinpath("default_policy.yaml").read_text(encoding="utf-8")
    return Policy.from_yaml(text, source="bus/default_policy.yaml")


# Matching


def _regex(pattern: str) -> str:
    """Translate a topic pattern (no ``{name}``) into a regular expression for fullmatch."""
    segments = pattern.split(":")
    last = len(segments) - 1
    parts = []
    for i, segment in enumerate(segments):
        if segment != "*":
            parts.append(re.escape(segment))
        elif i < last:
            parts.append("[^:]+")
        else:
            parts.append("[^:]+(?::[^:]+)*")
    return ":".join(parts)


def _covers(granted: Sequence[str], requested: Sequence[str]) -> bool:
    """Return whether every topic ``requested`` matches is matched by ``granted`` (segments)."""
    if granted[-1] == "*":
        # A trailing '*' takes one or more segments, so `requested` must reach at least as far.
        if len(requested) < len(granted):
            return False
        fixed = len(granted) - 1
    else:
        # A fixed-length grant covers only fixed-length requests of the same length.
        if requested[-1] == "*" or len(requested) != len(granted):
            return False
        fixed = len(granted)
    # A literal segment in the grant covers only the same literal, never a requested '*'.
    return all(g == "*" or g == r for g, r in zip(granted[:fixed], requested[:fixed], strict=True))


def _fill(pattern: str, name: str) -> str:
    # Safe because a name (CLIENT_ID_PATTERN) holds no ':' or '*': it stays one literal segment.
    return pattern.replace(_NAME, name)


# Validation


def _error(source: str, path: str, message: str) -> PolicyError:
    return PolicyError(f"{source}: {path}: {message}" if path else f"{source}: {message}")


def _pattern_problem(pattern: str) -> str | None:
    """Return what is wrong with a topic pattern from the policy, or None if it is valid."""
    if not pattern or len(pattern) > MAX_TOPIC_LENGTH:
        return f"a pattern must be 1 to {MAX_TOPIC_LENGTH} characters"
    for segment in pattern.split(":"):
        if segment in ("*", _NAME):
            continue
        for placeholder in _PLACEHOLDER.findall(segment):
            if placeholder != "name":
                return (
                    f"unknown placeholder {{{placeholder}}} in {pattern!r}; the only one is {_NAME}"
                )
        if _NAME in segment:
            return f"{pattern!r}: {_NAME} must be a whole segment"
        if "*" in segment:
            return f"{pattern!r}: '*' must be a whole segment"
        if SEGMENT_RE.fullmatch(segment) is None:
            return (
                f"{pattern!r}: segments are ':'-separated, non-empty, and use letters, digits, "
                "'.', '_', '-', a whole '*' or {name}"
            )
    return None


def _validate_role(role: Role, source: str) -> None:
    at = f"roles.{role.name}"
    if _ROLE_NAME.fullmatch(role.name) is None:
        raise _error(
            source, "roles", f"bad role name {role.name!r}: use lowercase letters, digits, '_', '-'"
        )
    if role.taint is not None and role.taint not in TAINT_LEVELS:
        raise _error(
            source, f"{at}.taint", f"{role.taint!r} is not one of {', '.join(TAINT_LEVELS)}"
        )
    _validate_members(role, source, at)
    _validate_sends(role, source, at)
    for i, pattern in enumerate(role.subscribe):
        problem = _pattern_problem(pattern)
        if problem:
            raise _error(source, f"{at}.subscribe[{i}]", problem)
        if not role.declassifier and pattern.split(":")[0] in _BCP_READING_HEADS:
            raise _error(
                source,
                f"{at}.subscribe[{i}]",
                f"{pattern!r} could match bcp: topics, which only the declassifier (gateway) "
                "role may read",
            )


def _validate_members(role: Role, source: str, at: str) -> None:
    """Each member is a clientId or ``prefix:*``; a declassifier's are exact clientIds."""
    for i, member in enumerate(role.members):
        prefix, _, name = member.partition(":")
        exact = _CLIENT_ID.fullmatch(member) is not None
        if not exact and not (name == "*" and _PREFIX.fullmatch(prefix)):
            raise _error(
                source,
                f"{at}.members[{i}]",
                f"{member!r} is neither a clientId (prefix:name) nor `prefix:*`; "
                "placeholders are not allowed in members",
            )
        if role.declassifier and not exact:
            raise _error(
                source, f"{at}.members[{i}]", "a declassifier role lists exact clientIds only"
            )


def _validate_sends(role: Role, source: str, at: str) -> None:
    """Each send rule names types and topic patterns; gateway-only types only for the
    declassifier."""
    for i, rule in enumerate(role.send):
        here = f"{at}.send[{i}]"
        if not rule.types:
            raise _error(source, f"{here}.types", "empty: list at least one message type")
        if not rule.topics:
            raise _error(source, f"{here}.topics", "empty: list at least one topic pattern")
        for j, type_ in enumerate(rule.types):
            if _TYPE_NAME.fullmatch(type_) is None:
                raise _error(source, f"{here}.types[{j}]", f"{type_!r} is not a message type name")
            if type_ in GATEWAY_ONLY_TYPES and not role.declassifier:
                raise _error(
                    source,
                    f"{here}.types[{j}]",
                    f"{type_} may be sent only by the declassifier (gateway) role",
                )
        for j, topic in enumerate(rule.topics):
            problem = _pattern_problem(topic)
            if problem:
                raise _error(source, f"{here}.topics[{j}]", problem)


def _check_declassifiers(roles: Iterable[Role], source: str) -> None:
    declassifiers = [role for role in roles if role.declassifier]
    if len(declassifiers) > 1:
        raise _error(
            source,
            f"roles.{declassifiers[1].name}.declassifier",
            f"only one role may be a declassifier, and {declassifiers[0].name} already is",
        )
    for role in declassifiers:
        if not role.members:
            # It could never be held: it cannot be assigned to anyone outside its members.
            raise _error(source, f"roles.{role.name}.members", "a declassifier role needs a member")


# The file's shape: only types and keys here; Policy checks what the values mean.


def _role_name(value: Any) -> Any:
    if not isinstance(value, str):
        strict_yaml.invalid(f"role name {value!r} must be a string")
    return value


def _roles(value: Any) -> Any:
    if not isinstance(value, dict) or not value:
        strict_yaml.invalid("required: a mapping of at least one role")
    return value


class _SendRuleFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    types: tuple[StrictStr, ...]
    topics: tuple[StrictStr, ...]


class _RoleFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    description: StrictStr = ""
    members: tuple[StrictStr, ...] = ()
    taint: TaintLevel | None = None
    declassifier: StrictBool = False
    admin: StrictBool = False
    send: tuple[_SendRuleFile, ...] = ()
    subscribe: tuple[StrictStr, ...] = ()

    def to_role(self, name: str) -> Role:
        return Role(
            name=name,
            members=self.members,
            send=tuple(SendRule(rule.types, rule.topics) for rule in self.send),
            subscribe=self.subscribe,
            taint=self.taint,
            declassifier=self.declassifier,
            admin=self.admin,
            description=self.description,
        )


class _PolicyFile(strict_yaml.VersionedFile):
    VERSION: ClassVar[int] = POLICY_VERSION
    roles: Annotated[
        dict[Annotated[str, BeforeValidator(_role_name)], _RoleFile], BeforeValidator(_roles)
    ] = Field(default=None, validate_default=True)  # so that a missing `roles:` gets _roles' words

    @model_validator(mode="before")
    @classmethod
    def _mapping(cls, data: Any) -> Any:
        if data is None:
            strict_yaml.invalid(
                f"the policy is empty; it needs `version: {POLICY_VERSION}` and at least one "
                "role under `roles:`"
            )
        if not isinstance(data, dict):
            strict_yaml.invalid("the top level must be a mapping of version and roles")
        return data
