"""The risk report of ``bcpbus agents check --json``: what each channel lets a reader say.

For every channel of a folder of agent definitions, and every spec a reader answers on it
(a subscription, a query template when definitions declare them, and the ad hoc queries the
channel allows), the report says how much free text a reader can put in front of the
controller's model per query and per budget, how many bits the timing of a delivery can add,
what Cat-1, a tighter format or sealing would save, and a one-line verdict. The models are built
by :mod:`peers.gateway.risk`; ``schemas/json/agents_check.json`` is generated from
:class:`RiskReport` for tools in other languages.

.. versionadded:: 0.3
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from schemas.bcp import AnomalyAction, Category, ExpectedFormat

__all__ = [
    "ChannelRisk",
    "FieldRisk",
    "RiskReport",
    "Saving",
    "SpecKind",
    "SpecRisk",
]

SpecKind = Literal["subscription", "query_template", "ad_hoc"]
"""Who fixes a spec: the controller's definition (a subscription or a query template), or the
controller at run time (ad hoc queries, within the channel's ``max_category`` and budget)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FieldRisk(_Model):
    """One field of a spec: a Cat-1 value, a Cat-2 answer or a Cat-3 summary."""

    name: str
    format: ExpectedFormat | Literal["boolean", "integer_range", "enum", "summary"]
    max_words: int
    """Words the reader may write; 0 for a Cat-1 value."""
    free_text: bool
    """Whether the reader chooses its words (``short_text``, ``short_list``, ``person_name``,
    ``email``, a summary): the text can say anything within its format and alphabet."""
    sealed: bool
    """Marked ``sealed: true``: the controller gets a handle, never the text."""
    bits: float
    """What the field is charged, without a Cat-2 spec's short-answer allowance."""


class Saving(_Model):
    """What one change would take away from a spec's exposure, per query."""

    words: int
    """Unsealed free-text words the controller's model would no longer read."""
    bits: float
    """Bits the spec would no longer be charged (sealing: the text's, less its word count's)."""
    how: str
    """The change, in words an operator can act on."""


class SpecRisk(_Model):
    """The exposure of one spec on one channel."""

    kind: SpecKind
    id: str
    """The subscription or template id; ``cat-2`` or ``cat-3`` for ad hoc queries."""
    category: Category
    fields: tuple[FieldRisk, ...]
    unsealed_fields: tuple[str, ...]
    """Free-text fields whose text reaches the controller."""
    unsealed_words: int
    """Free-text words a reader can put in front of the controller's model in one delivery."""
    human_approved: bool
    """Cat-3: a human approves every delivery first (the text still reaches the controller)."""
    bits: float
    """What one delivery is charged (the spec's bits)."""
    deliveries_per_budget: int
    """Deliveries the channel's budget pays for, each charged its bits and its outcome bit."""
    words_per_budget: int
    bits_per_budget: float
    timing_window_s: float | None
    """The time a reader can choose a delivery's moment within; ``None``: unbounded."""
    timing_bits: float | None
    """What that choice can carry per delivery at the controller's observable resolution;
    ``None``: unbounded (a subscription with neither ``min_interval_s`` nor ``max_per_hour``)."""
    gated: bool
    """Whether ``--strict`` holds this spec to ``--max-unsealed-words``: every spec the
    definitions fix; not ad hoc queries, whose size the controller chooses each time."""
    over_limit: bool
    savings: dict[Literal["sealing", "cat1", "tighter"], Saving]
    verdict: str
    """One line: what a reader can say here, and whether it is within the limit."""


class ChannelRisk(_Model):
    """A channel (both sides combined) and its specs."""

    channel: str
    """``bcp:<controller>:<reader>``."""
    controller: str
    reader: str
    controller_source: str
    max_category: Category
    budget_bits: float
    anomaly_action: AnomalyAction
    screeners: tuple[str, ...]
    specs: tuple[SpecRisk, ...]
    over_limit: bool
    verdict: str


class RiskReport(_Model):
    """``bcpbus agents check --json``: every channel of a folder of definitions."""

    agents_dir: str
    max_unsealed_words: int
    """The limit ``--strict`` holds every gated spec to, in unsealed words per delivery."""
    observed_resolution_s: float
    """The timing grain assumed for a delivery's moment (a channel's delivery quantum, when
    definitions have one)."""
    query_ttl_s: float
    channels: tuple[ChannelRisk, ...]
    passed: bool
    """No gated spec lets more than :attr:`max_unsealed_words` unsealed words through."""
