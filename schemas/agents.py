"""Agent definitions: Markdown files with YAML frontmatter, and the BCP channels they declare.

An agent definition (``agents/<name>.md``) is YAML frontmatter between ``---`` lines followed by
prose. The frontmatter of a controller and of its reader look like this:

.. code-block:: yaml

    name: main
    tools: Read, Write, BCPQuery          # or a YAML list
    network: none
    bcp_channels:
      - peer: researcher
        role: controller                  # this agent asks; "reader" answers
        max_category: 2                   # 1, 2 or 3
        budget_bits: 1000                 # > 0, shared by queries and subscription pushes
        max_cat2_queries: 10              # >= 0; omitted: no count limit
        anomaly_action: reject            # reject (default) | review | flag
        max_escalations_per_task: 2       # >= 0
        screeners: [system:screener-x]    # optional: peers that judge Cat-2/3 answers too
        screener_failure: reject          # reject (default) | review: a screener gave no verdict
        delivery_quantum: 0.1             # seconds: deliveries leave on this grid (0: off)
        sealed_to: ["tg:*", "role:approver"]  # who may get this channel's sealed values forwarded
        sealed_ttl: 3600                  # seconds a sealed value's handle lives
        subscriptions:                    # controller side only
          - id: research-alerts           # letters, digits, hyphens; unique in the channel
            category: 1                   # <= max_category
            fields:                       # the spec, exactly as in a query
              - {name: has_breaking_news, type: boolean}
            min_interval_s: 60            # rate limits; min_interval_s defaults to 10
            max_per_hour: 10

    name: researcher
    taint: high                           # default: high with a reader channel, else none
    command: [python, -m, myagents.researcher]   # how `bcpbus system` starts it (optional)
    bcp_channels:
      - {peer: main, role: reader, max_category: 2, budget_bits: 1000}

A channel is declared on both sides. When the two sides differ the stricter value holds (lower
``max_category``, ``budget_bits``, ``max_cat2_queries`` and ``max_escalations_per_task``; the
larger ``delivery_quantum``; the stricter ``anomaly_action`` and ``screener_failure``; the
screeners of both sides; the shorter ``sealed_ttl``; a forward destination must match the
``sealed_to`` of the controller's side and, if it declares one, of the reader's): either
operator may narrow a channel, neither may widen it.
:func:`build_channels` gives that combined view, one :class:`Channel` per (controller, reader).

Every inconsistency is a :class:`DefinitionError` that names the file and the field path:
:func:`parse_agent` checks one file, :func:`load_agents` a whole folder and the files against
each other.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Self

from croniter import croniter
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from schemas import strict_yaml
from schemas.bcp import (
    ActiveSubscription,
    AgentName,
    AnomalyAction,
    Category,
    QuerySpec,
    ScreenerFailure,
    ScreenerId,
    SubscriptionId,
)
from schemas.bus import ROLE_NAME_PATTERN
from schemas.common import APPROVAL_TOPIC, BUS_CLIENT_ID, GATEWAY_CLIENT_ID, TaintLevel

__all__ = [
    "DEFAULT_DELIVERY_QUANTUM",
    "DEFAULT_MAX_ESCALATIONS",
    "DEFAULT_MIN_INTERVAL_S",
    "DEFAULT_SEALED_TTL",
    "SEALED_TO_PATTERN",
    "SEALED_TO_ROLE",
    "MAX_SCREENERS",
    "RESERVED_SCREENERS",
    "AgentDefinition",
    "BcpChannel",
    "Channel",
    "CronSchedule",
    "DefinitionError",
    "Role",
    "Subscription",
    "build_channels",
    "check_agents",
    "load_agents",
    "parse_agent",
]

DEFAULT_MAX_ESCALATIONS: Final = 2
"""Escalations a task may make when its channel does not say (BCP "escalation budget")."""

DEFAULT_DELIVERY_QUANTUM: Final = 0.1
"""Seconds between the grid points deliveries to a controller leave on, when a channel does
not say (see :mod:`peers.gateway.timing`): 50 ms of latency on average, 100 ms at most. The
gateway's own round trip for an answer takes about 30 ms at the median on a loaded machine
(bench/README.md), so a reader that answers at once mostly lands in the first slot."""

DEFAULT_SEALED_TTL: Final = 3600.0
"""Seconds a sealed value's handle lives when a channel does not say: an hour, long enough for
a controller to decide where to forward it, short enough that a stale handle stops working."""

SEALED_TO_PATTERN: Final = r"^[a-z][a-z0-9_-]{0,31}:(\*|[A-Za-z0-9_-][A-Za-z0-9._-]{0,95})$"
"""A ``sealed_to`` entry: a clientId, its prefix and ``*`` (``tg:*``, ``human:alice``), or
``role:<name>``, a role of the bus policy (``role:approver``)."""

SEALED_TO_ROLE: Final = "role:"
"""The prefix of a ``sealed_to`` entry that names a policy role rather than clientIds: a peer
matches ``role:approver`` while the bus announces it holding ``approver``. ``role:`` is never a
clientId prefix here, and ``role:*`` (any role: anyone) is refused."""

DEFAULT_MIN_INTERVAL_S: Final = 10.0
"""Fewest seconds between two accepted pushes of a subscription that does not say."""

Role = Literal["controller", "reader"]
"""An agent's side of a BCP channel."""

_STRICTNESS: Final[dict[AnomalyAction, int]] = {"flag": 0, "review": 1, "reject": 2}

MAX_SCREENERS: Final = 8
"""Screeners one channel may name: each is asked about every Cat-2 and Cat-3 answer."""

RESERVED_SCREENERS: Final = frozenset(
    {GATEWAY_CLIENT_ID, BUS_CLIENT_ID, "system:presence", APPROVAL_TOPIC}
)
"""``system:`` names the bus and the gateway use themselves; none can be a screener."""

_Positive = Annotated[float, Field(gt=0, strict=True, allow_inf_nan=False)]
_Count = Annotated[StrictInt, Field(ge=0)]
_Quantum = Annotated[float, Field(ge=0, le=60, strict=True, allow_inf_nan=False)]
_Text = Annotated[StrictStr, Field(min_length=1, max_length=2000)]
_Word = Annotated[StrictStr, Field(max_length=4096, pattern=r"^[^\x00]+$")]


class DefinitionError(ValueError):
    """An agent definition is inconsistent; nothing should start until it is fixed.

    Args:
        source: the file (or other origin) of the definition.
        field: the path of the offending field, such as
            ``bcp_channels[0].subscriptions[1].category``.
        message: what is wrong, in words an operator can act on.
    """

    def __init__(self, source: str, field: str, message: str) -> None:
        self.source = source
        self.field = field
        self.message = message
        super().__init__(source, field, message)

    def __str__(self) -> str:
        return f"{self.source}: {self.field}: {self.message}"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CronSchedule(_Model):
    """A scheduled prompt: at each time ``schedule`` names, ``bcpbus system`` sends the agent
    a ``scheduled_message`` carrying ``message`` (starting the agent first if it has a
    ``command:`` and is not running). The bus itself runs no schedules.

    ``schedule`` is a standard five-field cron expression (minute, hour, day of month, month,
    day of week), read in UTC, or one of ``@hourly``, ``@daily``, ``@weekly``, ``@monthly``,
    ``@yearly``; :mod:`croniter` reads it.
    """

    schedule: _Text
    message: _Text
    label: _Text | None = None

    @field_validator("schedule")
    @classmethod
    def _check_schedule(cls, value: str) -> str:
        # croniter also takes six and seven fields (seconds, years); the seed's format, and
        # every crontab an operator has written, has five.
        if not (value.startswith("@") or len(value.split()) == 5) or not croniter.is_valid(value):
            strict_yaml.invalid(
                f"{value!r} is not a cron schedule: give five fields, minute hour day-of-month "
                "month day-of-week (e.g. '0 */2 * * *', every two hours, UTC), or @hourly, "
                "@daily, @weekly, @monthly, @yearly"
            )
        return value


class Subscription(QuerySpec):
    """A subscription a controller declares: what its reader may push, and how often.

    The spec fields are those of :class:`~schemas.bcp.QuerySpec` (BCP Subscriptions: "the same
    schema as queries").
    """

    id: SubscriptionId
    min_interval_s: _Positive = DEFAULT_MIN_INTERVAL_S
    """Fewest seconds between two accepted pushes; every subscription has one, since whether
    and when a push comes is itself something the reader chooses (docs/bcp.md)."""
    max_per_hour: Annotated[StrictInt, Field(ge=1)] | None = None
    """Most accepted pushes in any hour."""

    def active(self, controller: str) -> ActiveSubscription:
        """Return this subscription as an entry of ``bcp_subscriptions_active``."""
        spec = self.as_spec().model_dump(exclude_none=True)
        return ActiveSubscription.model_validate(
            {"subscription_id": self.id, "controller": controller, **spec}
        )


class BcpChannel(_Model):
    """One side of a BCP channel, as one ``bcp_channels`` entry declares it."""

    peer: AgentName
    role: Role
    max_category: Category
    budget_bits: _Positive
    max_cat2_queries: _Count | None = None
    """Cat-2 queries allowed per session; ``None``: only the budget limits them."""
    anomaly_action: AnomalyAction = "reject"
    max_escalations_per_task: _Count = DEFAULT_MAX_ESCALATIONS
    screeners: Annotated[tuple[ScreenerId, ...], Field(max_length=MAX_SCREENERS)] = ()
    """Peers (``system:<name>``) the gateway asks about every Cat-2 and Cat-3 answer, besides
    its own screen. See docs/bcp.md, "Screeners"."""
    screener_failure: ScreenerFailure = "reject"
    """What an answer a screener gave no usable verdict on becomes: refused, or held for review."""
    delivery_quantum: _Quantum = DEFAULT_DELIVERY_QUANTUM
    """Seconds: every delivery to the controller leaves at a point of this grid, so that a
    reader's timing within a step, and its retries, are not visible; the step it lands in is
    charged. 0 turns the grid off and leaves timing uncounted (tests, trusted readers).

    .. versionadded:: 0.3"""
    sealed_to: Annotated[
        tuple[Annotated[str, Field(pattern=SEALED_TO_PATTERN)], ...], Field(max_length=64)
    ] = ()
    """Where a ``bcp_forward`` may send this channel's sealed values: clientIds, ``prefix:*``,
    or ``role:<name>`` (a peer the bus announced holding that policy role). Whatever the entry,
    humans (``tg:``, ``human:``) read them as data; an ``agent:`` must be tainted at least as
    high as the text, never ``none``. Empty: sealed values cannot be forwarded.

    .. versionadded:: 0.4
    .. versionchanged:: 0.4 ``role:<name>`` entries."""
    sealed_ttl: _Positive = DEFAULT_SEALED_TTL
    """Seconds a sealed value's handle lives.

    .. versionadded:: 0.4"""
    subscriptions: tuple[Subscription, ...] = ()

    @model_validator(mode="after")
    def _check_screeners(self) -> Self:
        seen: set[str] = set()
        for index, screener in enumerate(self.screeners):
            if screener in RESERVED_SCREENERS:
                strict_yaml.invalid(
                    f"{screener} is the bus's or the gateway's own name, not a screener",
                    at=f"screeners[{index}]",
                )
            if screener in seen:
                strict_yaml.invalid(f"duplicate screener {screener!r}", at=f"screeners[{index}]")
            seen.add(screener)
        return self

    @model_validator(mode="after")
    def _check_sealed_to(self) -> Self:
        for index, entry in enumerate(self.sealed_to):
            role = entry.removeprefix(SEALED_TO_ROLE)
            if role != entry and not re.fullmatch(ROLE_NAME_PATTERN, role):
                # role:* would be "any peer with any role": everyone. Fail closed at load time.
                strict_yaml.invalid(
                    f"{entry!r}: a role entry is role:<name>, the name as in the bus policy "
                    "(lowercase letters, digits, '_', '-'), never role:*",
                    at=f"sealed_to[{index}]",
                )
        return self

    @model_validator(mode="after")
    def _check_subscriptions(self) -> Self:
        if self.subscriptions and self.role == "reader":
            strict_yaml.invalid(
                "only a controller channel declares subscriptions", at="subscriptions"
            )
        seen: set[str] = set()
        for index, subscription in enumerate(self.subscriptions):
            if subscription.category > self.max_category:
                strict_yaml.invalid(
                    f"category {subscription.category} is above the channel's max_category "
                    f"{self.max_category}",
                    at=f"subscriptions[{index}].category",
                )
            if subscription.id in seen:
                strict_yaml.invalid(
                    f"duplicate subscription id {subscription.id!r}",
                    at=f"subscriptions[{index}].id",
                )
            seen.add(subscription.id)
        return self


class AgentDefinition(_Model):
    """The frontmatter of one agent definition; :attr:`body` is the prose under it."""

    name: AgentName
    description: _Text | None = None
    model: _Text | None = None
    tools: tuple[StrictStr, ...] = ()
    """Tool names; the seed writes them as one comma-separated string, a list works too."""
    network: StrictStr = "none"
    cron_schedules: tuple[CronSchedule, ...] = ()
    taint: TaintLevel | None = None
    """Omitted: ``high`` for an agent with a reader channel, ``none`` otherwise."""
    command: Annotated[tuple[_Word, ...], Field(min_length=1, max_length=256)] | None = None
    """The program and its arguments that ``bcpbus system`` runs to start this agent, run
    without a shell in the definition's folder; a YAML list, or one string split as a shell
    would (``shlex``). A first word ``python`` is the interpreter that runs ``bcpbus``. The
    token comes through the environment (``BCPBUS_TOKEN``), never here. Omitted: the agent
    is started some other way and a ``spawn_request`` for it is refused.

    .. versionadded:: 0.2
    """
    bcp_channels: tuple[BcpChannel, ...] = ()

    _source: str | None = PrivateAttr(default=None)
    _body: str = PrivateAttr(default="")

    @field_validator("tools", mode="before", json_schema_input_type=StrictStr | list[StrictStr])
    @classmethod
    def _split_tools(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(tool.strip() for tool in value.split(",") if tool.strip())
        return value

    @field_validator(
        "command", mode="before", json_schema_input_type=StrictStr | list[StrictStr] | None
    )
    @classmethod
    def _split_command(cls, value: Any) -> Any:
        words = value
        if value is None:
            return None
        if isinstance(value, str):
            try:
                words = shlex.split(value)
            except ValueError as exc:  # "No closing quotation"
                strict_yaml.invalid(f"cannot split the command into words: {exc}")
        elif not isinstance(value, list | tuple):
            strict_yaml.invalid("expected a list of words, e.g. [python, -m, mypackage.agent]")
        if not words:
            strict_yaml.invalid("give the program to run, e.g. [python, -m, mypackage.agent]")
        for index, word in enumerate(words):
            if word == "" or (isinstance(word, str) and "\x00" in word):
                strict_yaml.invalid(f"word {index} is empty or holds a NUL character")
        return words

    @model_validator(mode="after")
    def _check_channels(self) -> Self:
        seen: set[tuple[str, str]] = set()
        for index, channel in enumerate(self.bcp_channels):
            if channel.peer == self.name:
                strict_yaml.invalid(
                    "a channel to the agent itself", at=f"bcp_channels[{index}].peer"
                )
            if (channel.peer, channel.role) in seen:
                strict_yaml.invalid(
                    f"a second {channel.role} channel with peer {channel.peer!r}",
                    at=f"bcp_channels[{index}].peer",
                )
            seen.add((channel.peer, channel.role))
        if self.taint == "none" and self.reader_channels:
            # A reader reads attacker-written text; the bus's no-write-down rule relies on this.
            strict_yaml.invalid("an agent with a reader channel cannot have taint none", at="taint")
        return self

    @property
    def source(self) -> str:
        """Where the definition came from: its file, when it was parsed from one."""
        return self._source or f"<agent {self.name}>"

    @property
    def body(self) -> str:
        """The Markdown prose under the frontmatter: the agent's instructions."""
        return self._body

    @property
    def effective_taint(self) -> TaintLevel:
        """The agent's taint: ``taint`` if set, else ``high`` for a reader, else ``none``."""
        if self.taint is not None:
            return self.taint
        return "high" if self.reader_channels else "none"

    @property
    def controller_channels(self) -> tuple[BcpChannel, ...]:
        """The channels on which this agent asks."""
        return tuple(c for c in self.bcp_channels if c.role == "controller")

    @property
    def reader_channels(self) -> tuple[BcpChannel, ...]:
        """The channels on which this agent answers."""
        return tuple(c for c in self.bcp_channels if c.role == "reader")

    def channel_to(self, peer: str, role: Role | None = None) -> BcpChannel | None:
        """Return this agent's channel with ``peer`` (in ``role``, if given), or ``None``."""
        for channel in self.bcp_channels:
            if channel.peer == peer and role in (None, channel.role):
                return channel
        return None


@dataclass(frozen=True, slots=True)
class Channel:
    """A BCP channel as the gateway enforces it: both sides' declarations combined.

    Build these with :func:`build_channels`; the values are the stricter of the two sides.
    """

    controller: str
    reader: str
    max_category: Category
    budget_bits: float
    max_cat2_queries: int | None
    max_escalations_per_task: int
    anomaly_action: AnomalyAction
    subscriptions: tuple[Subscription, ...]
    reader_taint: TaintLevel
    controller_source: str
    reader_source: str
    screeners: tuple[str, ...] = ()
    """The screeners both sides name, the controller's first; each judges Cat-2 and Cat-3."""
    screener_failure: ScreenerFailure = "reject"
    delivery_quantum: float = DEFAULT_DELIVERY_QUANTUM
    """The larger of the two sides' ``delivery_quantum``."""
    sealed_to: tuple[tuple[str, ...], ...] = ((),)
    """Each side's ``sealed_to`` (the controller's first; the reader's only if it declares
    one): a forward destination must match an entry of every one (a clientId pattern, or a
    ``role:<name>`` the destination holds)."""
    sealed_ttl: float = DEFAULT_SEALED_TTL
    """The shorter of the two sides' ``sealed_ttl``."""
    taints: tuple[tuple[str, TaintLevel], ...] = ()
    """Every defined agent's name and taint: what a forward to ``agent:<name>`` is checked
    against (an agent not listed counts as untainted)."""

    @property
    def key(self) -> tuple[str, str]:
        """``(controller, reader)``: how :func:`build_channels` indexes it."""
        return self.controller, self.reader

    @property
    def topic(self) -> str:
        """The bus topic of the channel, ``bcp:<controller>:<reader>``."""
        return f"bcp:{self.controller}:{self.reader}"

    def allows(self, category: int) -> bool:
        """Return whether a query of ``category`` is within ``max_category``."""
        return 1 <= category <= self.max_category

    def subscription(self, subscription_id: str) -> Subscription | None:
        """Return the subscription with ``subscription_id``, or ``None``."""
        for subscription in self.subscriptions:
            if subscription.id == subscription_id:
                return subscription
        return None

    def active_subscriptions(self) -> tuple[ActiveSubscription, ...]:
        """Return the entries this channel adds to its reader's ``bcp_subscriptions_active``."""
        return tuple(s.active(self.controller) for s in self.subscriptions)


def _split_frontmatter(text: str, source: str) -> tuple[str, str]:
    lines = text.removeprefix("\ufeff").splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise DefinitionError(source, "frontmatter", "the file must start with a --- line")
    for index, line in enumerate(lines[1:], start=1):
        if line.strip() in ("---", "..."):
            return "".join(lines[1:index]), "".join(lines[index + 1 :]).strip()
    raise DefinitionError(source, "frontmatter", "no closing --- line")


def parse_agent(text: str, *, source: str) -> AgentDefinition:
    """Parse one agent definition: YAML frontmatter between ``---`` lines, then Markdown.

    Args:
        text: the file's content.
        source: where it came from (a path); every error names it.

    Returns:
        The definition, with :attr:`AgentDefinition.source` and :attr:`AgentDefinition.body`
        set. It is checked on its own; use :func:`load_agents` or :func:`check_agents` to check
        it against its peers.

    Raises:
        DefinitionError: the frontmatter is missing, is not YAML (duplicate keys included) or
            does not describe a valid agent.
    """
    frontmatter, body = _split_frontmatter(text, source)
    try:
        # The frontmatter starts on the file's second line, after the opening ---.
        definition = strict_yaml.load_model(
            AgentDefinition, frontmatter, source=source, first_line=2
        )
    except strict_yaml.LoadError as exc:
        raise DefinitionError(source, exc.path or "frontmatter", exc.message) from exc
    definition._source = source
    definition._body = body
    return definition


def load_agents(directory: str | os.PathLike[str]) -> dict[str, AgentDefinition]:
    """Load and cross-check every agent definition (``*.md`` but ``README.md``) of a folder.

    Args:
        directory: the folder, such as ``agents/``; subfolders are not read.

    Returns:
        The definitions by agent name, in file name order.

    Raises:
        DefinitionError: a file is invalid (see :func:`parse_agent`) or the files disagree
            (see :func:`check_agents`). Stop and report it: no channel is safe to run.
        OSError: the folder or a file cannot be read.
    """
    paths = sorted(
        path
        for path in Path(directory).glob("*.md")
        if path.is_file() and path.name.lower() != "readme.md"
    )
    definitions = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise DefinitionError(str(path), "frontmatter", "the file is not UTF-8") from exc
        definitions.append(parse_agent(text, source=str(path)))
    return check_agents(definitions)


def check_agents(definitions: Iterable[AgentDefinition]) -> dict[str, AgentDefinition]:
    """Check definitions against each other and index them by name.

    Checks that names are unique and that every channel is declared on both sides (a controller
    channel has its reader's ``role: reader`` channel back, and the reverse), which
    :func:`build_channels` also needs.

    Returns:
        The definitions by name.

    Raises:
        DefinitionError: naming the later of two files with one name, or the file whose channel
            has no counterpart.
    """
    agents: dict[str, AgentDefinition] = {}
    for definition in definitions:
        if (first := agents.get(definition.name)) is not None:
            message = f"agent {definition.name!r} is already defined in {first.source}"
            raise DefinitionError(definition.source, "name", message)
        agents[definition.name] = definition
    build_channels(agents)
    return agents


def build_channels(agents: Mapping[str, AgentDefinition]) -> dict[tuple[str, str], Channel]:
    """Combine both sides of every channel into the :class:`Channel` the gateway enforces.

    Args:
        agents: definitions by name, such as :func:`load_agents` returns.

    Returns:
        The channels by ``(controller, reader)``.

    Raises:
        DefinitionError: a channel names an undefined peer, lacks its counterpart, or has a
            subscription above the combined ``max_category``.
    """
    channels: dict[tuple[str, str], Channel] = {}
    taints = tuple((name, agent.effective_taint) for name, agent in sorted(agents.items()))
    for agent in agents.values():
        for index, side in enumerate(agent.bcp_channels):
            where = f"bcp_channels[{index}]"
            peer = agents.get(side.peer)
            if peer is None:
                message = f"no agent named {side.peer!r} is defined"
                raise DefinitionError(agent.source, f"{where}.peer", message)
            other_role: Role = "reader" if side.role == "controller" else "controller"
            other = peer.channel_to(agent.name, other_role)
            if other is None:
                message = (
                    f"{side.peer!r} ({peer.source}) has no `role: {other_role}` channel "
                    f"with peer {agent.name!r}"
                )
                raise DefinitionError(agent.source, where, message)
            if side.role == "controller":
                channel = _combine(agent, side, peer, other, taints)
                _check_combined(channel, agent.source, where)
                channels[channel.key] = channel
    return channels


def _combine(
    controller: AgentDefinition,
    ours: BcpChannel,
    reader: AgentDefinition,
    theirs: BcpChannel,
    taints: tuple[tuple[str, TaintLevel], ...],
) -> Channel:
    cat2 = [n for n in (ours.max_cat2_queries, theirs.max_cat2_queries) if n is not None]
    action = max(ours.anomaly_action, theirs.anomaly_action, key=_STRICTNESS.__getitem__)
    # A screener more is stricter: each side's screeners all judge the channel's answers.
    screeners = tuple(dict.fromkeys((*ours.screeners, *theirs.screeners)))
    sides = (ours.screener_failure, theirs.screener_failure)
    failure: ScreenerFailure = "reject" if "reject" in sides else "review"
    return Channel(
        controller=controller.name,
        reader=reader.name,
        max_category=min(ours.max_category, theirs.max_category),
        budget_bits=min(ours.budget_bits, theirs.budget_bits),
        max_cat2_queries=min(cat2) if cat2 else None,
        max_escalations_per_task=min(
            ours.max_escalations_per_task, theirs.max_escalations_per_task
        ),
        anomaly_action=action,
        subscriptions=ours.subscriptions,
        reader_taint=reader.effective_taint,
        controller_source=controller.source,
        reader_source=reader.source,
        screeners=screeners,
        screener_failure=failure,
        # A coarser grid is stricter: less of the reader's timing shows.
        delivery_quantum=max(ours.delivery_quantum, theirs.delivery_quantum),
        # A reader's side that names no destinations leaves the controller's list in force.
        sealed_to=(ours.sealed_to, *((theirs.sealed_to,) if theirs.sealed_to else ())),
        sealed_ttl=min(ours.sealed_ttl, theirs.sealed_ttl),
        taints=taints,
    )


def _check_combined(channel: Channel, source: str, where: str) -> None:
    if len(channel.screeners) > MAX_SCREENERS:
        raise DefinitionError(
            source,
            f"{where}.screeners",
            f"the two sides name {len(channel.screeners)} screeners together; at most "
            f"{MAX_SCREENERS}",
        )
    for index, subscription in enumerate(channel.subscriptions):
        if not channel.allows(subscription.category):
            raise DefinitionError(
                source,
                f"{where}.subscriptions[{index}].category",
                f"category {subscription.category} is above max_category "
                f"{channel.max_category} of reader {channel.reader!r} ({channel.reader_source})",
            )
