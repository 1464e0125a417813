"""The risk report of a folder of agent definitions: what each channel lets a reader say.

The screen cannot be the boundary (docs/bcp.md, "What the screen cannot catch"): a reader that
may write 50 words of free text can write an instruction that reads as a fact. What bounds it is
how much free text reaches the controller's model at all. This module computes that bound from
the definitions alone, before anything runs, as pure functions:

- :func:`spec_risk`: one spec (a subscription, a query template, the ad hoc queries a channel
  allows): the unsealed free-text words and fields per delivery, the bits, how many deliveries
  the budget pays for, the timing bits, what Cat-1, a tighter format or sealing would save, and
  a one-line verdict;
- :func:`channel_risk` and :func:`report`: every spec of every channel, and whether all the
  specs the definitions fix stay within ``max_unsealed_words`` (what ``--strict`` checks).

A field marked ``sealed: true`` (the question, or its whole spec) counts as sealed and as not
delivered to the controller: the controller gets a handle and facts, never the text
(:mod:`peers.gateway.core.sealed`).

``bcpbus agents check`` prints the report (:mod:`peers.gateway.risk_command`); ``bcpbus
serve`` prints each channel's verdict at start.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any, Final, TypedDict

from schemas.agents import AgentDefinition, Channel, Subscription, build_channels
from schemas.bcp import MAX_WORDS_LIMIT, Category, QuerySpec
from schemas.risk import ChannelRisk, FieldRisk, RiskReport, Saving, SpecKind, SpecRisk

from .bits import (
    BITS_PER_WORD,
    TEXT_FORMATS,
    delivered_spec_bits,
    facts_bits,
    field_bits,
    question_bits,
)

__all__ = [
    "CAT1_FIELD_BITS",
    "DEFAULT_MAX_UNSEALED_WORDS",
    "OBSERVED_RESOLUTION_S",
    "TIGHT_WORDS",
    "channel_risk",
    "delivery_quantum",
    "report",
    "spec_risk",
    "timing_bits",
]

DEFAULT_MAX_UNSEALED_WORDS: Final = 32
"""``--strict``'s default: unsealed free-text words one delivery may put before a controller.

One ordinary finding and its topic fit: of the 200 ordinary ``research-findings`` pushes the
capacity tests use (``tests/peers/gateway/test_bits.py``), the longest finding has 23 words and
the longest topic 7. A 50-word field, where 96% of the injections written against the screen
(the adaptive set of ``python -m bench containment``) were delivered, does not."""

TIGHT_WORDS: Final = 8
"""The word limit "a tighter format" proposes for a free-text field: a name, a title, a phrase."""

CAT1_FIELD_BITS: Final = 4.0
"""What "Cat-1 instead" proposes for a free-text field: an enum of 16 values the controller
lists (its own words, so nothing in them is the reader's)."""

OBSERVED_RESOLUTION_S: Final = 0.001
"""The finest time step a controller is assumed to tell deliveries apart by (a millisecond
timestamp), when the channel has no delivery quantum."""

_OUTCOME_BIT: Final = 1.0  # docs/bcp.md "Outcome charges": a delivery is charged 1 bit more
_FIRST_SLOT_BITS: Final = 2.0  # docs/bcp.md "Time": the cheapest slot of a grid, slot 0


# Timing


def delivery_quantum(channel: Channel) -> float:
    """Return the time grain of a channel's deliveries, as the controller can observe it.

    Deliveries leave on the channel's ``delivery_quantum`` grid; a channel that turns the grid
    off (0) delivers at once, and the grain is then :data:`OBSERVED_RESOLUTION_S`.
    """
    return max(channel.delivery_quantum, OBSERVED_RESOLUTION_S)


def timing_bits(window_s: float | None, quantum_s: float) -> float | None:
    """Return what choosing a delivery's moment can carry: log2(1 + window / quantum).

    The reader picks one of the ``window / quantum`` slots of the window, or none at all.
    ``None`` (unbounded) when ``window_s`` is ``None``.
    """
    if window_s is None:
        return None
    return math.log2(1 + window_s / quantum_s)


def _window(spec: QuerySpec, query_ttl: float) -> float | None:
    if not isinstance(spec, Subscription):
        return query_ttl  # a reader answers any time before the query expires
    # Every subscription has a min_interval_s now (10 s by default); an hourly cap that spaces
    # pushes further apart is the tighter bound on when one comes.
    hourly = 3600.0 / spec.max_per_hour if spec.max_per_hour is not None else 0.0
    return max(float(spec.min_interval_s), hourly)


# One spec


def _fields(spec: QuerySpec, sealed: Iterable[str] = ()) -> tuple[FieldRisk, ...]:
    marked = set(sealed) | spec.sealed_keys()
    if spec.category == 1:
        kinds = {"boolean": "boolean", "integer": "integer_range", "enum": "enum"}
        return tuple(
            FieldRisk(
                name=f.name,
                format=kinds[f.type],
                max_words=0,
                free_text=False,
                sealed=False,
                bits=field_bits(f),
            )
            for f in spec.fields or ()
        )
    if spec.category == 2:
        return tuple(
            FieldRisk(
                name=q.id,
                format=q.expected_format,
                max_words=q.max_words,
                free_text=q.expected_format in TEXT_FORMATS,
                sealed=q.id in marked,
                bits=question_bits(q),
            )
            for q in spec.questions or ()
        )
    words = spec.max_words or 0
    return (
        FieldRisk(
            name="summary",
            format="summary",
            max_words=words,
            free_text=True,
            sealed="summary" in marked,
            bits=float(BITS_PER_WORD * words),
        ),
    )


def spec_risk(
    kind: SpecKind,
    spec_id: str,
    spec: QuerySpec,
    *,
    budget_bits: float,
    quantum_s: float,
    query_ttl: float,
    max_unsealed_words: int,
    sealed: Iterable[str] = (),
    grid: bool = True,
) -> SpecRisk:
    """Return the exposure of one spec: per delivery, per budget, and its one-line verdict.

    Args:
        kind: who fixes the spec; ad hoc queries are reported but not gated.
        spec_id: the subscription or template id, or what the ad hoc spec stands for.
        spec: the spec (a subscription carries its ``min_interval_s`` and ``max_per_hour``).
        budget_bits: the channel's budget per session.
        quantum_s: the time grain of the channel's deliveries (:func:`delivery_quantum`).
        query_ttl: seconds a reader has to answer a query.
        max_unsealed_words: the limit a gated spec is held to.
        sealed: fields to count as sealed besides those the spec marks ``sealed: true``.
        grid: whether deliveries leave on a grid (``delivery_quantum`` above 0): each then
            pays at least its first slot, and the verdict says when timing goes uncharged.
    """
    fields = _fields(spec, sealed)
    open_fields = [f for f in fields if f.free_text and not f.sealed]
    words = sum(f.max_words for f in open_fields)
    bits = delivered_spec_bits(spec)
    window, gated = _window(spec, query_ttl), kind != "ad_hoc"
    risk = SpecRisk(
        kind=kind,
        id=spec_id,
        category=spec.category,
        fields=fields,
        unsealed_fields=tuple(f.name for f in open_fields),
        unsealed_words=words,
        human_approved=spec.category == 3,
        bits=bits,
        **_per_budget(budget_bits, bits, words, grid),
        timing_window_s=window,
        timing_bits=timing_bits(window, quantum_s),
        gated=gated,
        over_limit=gated and words > max_unsealed_words,
        savings=_savings(open_fields),
        verdict="",
    )
    return risk.model_copy(update={"verdict": _verdict(risk, max_unsealed_words, grid)})


class _PerBudget(TypedDict):
    deliveries_per_budget: int
    words_per_budget: int
    bits_per_budget: float


def _per_budget(budget_bits: float, bits: float, words: int, grid: bool) -> _PerBudget:
    """How many deliveries of ``bits`` (and ``words`` unsealed words) a budget pays for, each
    with its outcome bit and, on a grid, its first slot; and their words and bits."""
    count = int(budget_bits // (bits + _OUTCOME_BIT + (_FIRST_SLOT_BITS if grid else 0.0)))
    return _PerBudget(
        deliveries_per_budget=count, words_per_budget=count * words, bits_per_budget=count * bits
    )


def _savings(open_fields: list[FieldRisk]) -> dict[Any, Saving]:
    words = sum(f.max_words for f in open_fields)
    text_bits = math.fsum(f.bits for f in open_fields)
    names = ", ".join(f.name for f in open_fields)
    cut = [f for f in open_fields if f.max_words > TIGHT_WORDS]
    cut_words = sum(f.max_words - TIGHT_WORDS for f in cut)
    return {
        "sealing": Saving(
            words=words,
            bits=math.fsum(max(0.0, f.bits - facts_bits(f.max_words)) for f in open_fields),
            how=f"seal {names}" if names else "no free text to seal",
        ),
        "cat1": Saving(
            words=words,
            bits=max(0.0, text_bits - CAT1_FIELD_BITS * len(open_fields)),
            how=f"ask {names} as Cat-1 enums of 16 values" if names else "already typed values",
        ),
        "tighter": Saving(
            words=cut_words,
            bits=float(BITS_PER_WORD * cut_words),
            how=(
                f"cut {', '.join(f.name for f in cut)} to {TIGHT_WORDS} words each"
                if cut
                else f"every free-text field is {TIGHT_WORDS} words or fewer"
            ),
        ),
    }


def _verdict(risk: SpecRisk, limit: int, grid: bool = True) -> str:
    what = {"subscription": "push", "query_template": "query", "ad_hoc": "query"}[risk.kind]
    name = f"ad hoc Cat-{risk.category} queries" if risk.kind == "ad_hoc" else risk.id
    timing = (
        "timing unbounded (no min_interval_s or max_per_hour)"
        if risk.timing_bits is None
        else f"timing {risk.timing_bits:.1f} bits"
    )
    if risk.timing_bits is not None and not grid:
        timing += " uncharged (delivery_quantum: 0)"
    head = (
        f"{name}: {risk.unsealed_words} unsealed words a {what}, {risk.bits:.1f} bits, "
        f"{risk.deliveries_per_budget} a budget, {timing}"
    )
    if risk.unsealed_words == 0:
        return f"{head}: ok, no free text reaches the controller"
    approved = "; a human approves each" if risk.human_approved else ""
    if not risk.gated:
        return f"{head}{approved}: the controller chooses each spec (not gated)"
    if risk.over_limit:
        return (
            f"{head}{approved}: FAIL, more than {limit}: {risk.savings['sealing'].how}, "
            f"or {risk.savings['tighter'].how}"
        )
    return f"{head}{approved}: ok, within {limit}"


# Channels


def _ad_hoc(channel: Channel) -> list[tuple[Category, QuerySpec]]:
    """The largest ad hoc queries of each free-text category the channel allows."""
    words = max(1, min(MAX_WORDS_LIMIT, int(channel.budget_bits // BITS_PER_WORD)))
    specs: list[tuple[Category, QuerySpec]] = []
    if channel.max_category >= 2:
        question = {"id": "answer", "question": "?", "max_words": words}
        cat2 = {"category": 2, "questions": [question | {"expected_format": "short_text"}]}
        specs.append((2, QuerySpec.model_validate(cat2)))
    if channel.max_category >= 3:
        cat3 = {"category": 3, "directive": "?", "max_words": words}
        specs.append((3, QuerySpec.model_validate(cat3)))
    return specs


def channel_risk(
    channel: Channel,
    *,
    query_ttl: float,
    max_unsealed_words: int = DEFAULT_MAX_UNSEALED_WORDS,
) -> ChannelRisk:
    """Return the risk of every spec of ``channel``: its subscriptions, then ad hoc queries."""
    risk = partial(
        spec_risk,
        budget_bits=channel.budget_bits,
        quantum_s=delivery_quantum(channel),
        query_ttl=query_ttl,
        max_unsealed_words=max_unsealed_words,
        grid=channel.delivery_quantum > 0,
    )
    specs = [risk("subscription", s.id, s) for s in channel.subscriptions]
    specs += [risk("ad_hoc", f"cat-{category}", spec) for category, spec in _ad_hoc(channel)]
    over = [s for s in specs if s.over_limit]
    worst = max((s.unsealed_words for s in specs if s.gated), default=0)
    verdict = (
        f"{channel.topic}: FAIL, {', '.join(s.id for s in over)} let more than "
        f"{max_unsealed_words} unsealed words a delivery reach {channel.controller}"
        if over
        else f"{channel.topic}: ok, at most {worst} unsealed words a delivery from its "
        f"subscriptions (limit {max_unsealed_words})"
    )
    return ChannelRisk(
        channel=channel.topic,
        controller=channel.controller,
        reader=channel.reader,
        controller_source=channel.controller_source,
        max_category=channel.max_category,
        budget_bits=channel.budget_bits,
        anomaly_action=channel.anomaly_action,
        screeners=channel.screeners,
        specs=tuple(specs),
        over_limit=bool(over),
        verdict=verdict,
    )


def report(
    agents: Mapping[str, AgentDefinition],
    *,
    agents_dir: str,
    query_ttl: float = 300.0,
    max_unsealed_words: int = DEFAULT_MAX_UNSEALED_WORDS,
) -> RiskReport:
    """Return the risk report of checked definitions (:func:`schemas.agents.load_agents`).

    Its ``passed`` is what ``--strict`` exits on.
    """
    channels = tuple(
        channel_risk(c, query_ttl=query_ttl, max_unsealed_words=max_unsealed_words)
        for c in build_channels(agents).values()
    )
    return RiskReport(
        agents_dir=agents_dir,
        max_unsealed_words=max_unsealed_words,
        observed_resolution_s=OBSERVED_RESOLUTION_S,
        query_ttl_s=query_ttl,
        channels=channels,
        passed=not any(c.over_limit for c in channels),
    )
