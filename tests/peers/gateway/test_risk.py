"""The risk report of peers/gateway/risk.py: words, bits and timing per spec, verdicts, seals."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, strategies as st

from bus.core.identities import default_agents_dir
from peers.gateway.risk import (
    DEFAULT_MAX_UNSEALED_WORDS,
    OBSERVED_RESOLUTION_S,
    TIGHT_WORDS,
    report,
    spec_risk,
    timing_bits,
)
from schemas.agents import DefinitionError, Subscription, load_agents
from schemas.bcp import QuerySpec

READER = """---
name: reader
bcp_channels:
  - {peer: boss, role: reader, max_category: 2, budget_bits: 2000}
---
"""

BOSS = """---
name: boss
bcp_channels:
  - peer: reader
    role: controller
    max_category: 2
    budget_bits: 2000
    subscriptions:
      - id: notes
        category: 2
        min_interval_s: 60
        questions:
          - {id: note, question: "What happened?", max_words: 50, expected_format: short_text%s}
          - {id: day, question: "When?", max_words: 1, expected_format: date}
---
"""


def write_agents(folder: Path, sealed: str = "") -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "reader.md").write_text(READER, encoding="utf-8")
    (folder / "boss.md").write_text(BOSS % sealed, encoding="utf-8")
    return folder


def check(folder: Path) -> Any:
    return report(load_agents(folder), agents_dir=str(folder))


def test_the_reference_agents_pass_and_their_findings_carry_10_words():
    """research-findings puts a 10-word topic before main and seals its 50-word finding (charged
    its word count, log2 51 bits); ad hoc queries are not gated."""
    agents_dir = default_agents_dir()
    assert agents_dir is not None
    result = check(agents_dir)
    assert result.passed
    (channel,) = result.channels
    specs = {s.id: s for s in channel.specs}
    findings = specs["research-findings"]
    assert findings.unsealed_fields == ("topic",)
    assert findings.unsealed_words == 10 <= DEFAULT_MAX_UNSEALED_WORDS
    assert findings.bits == pytest.approx(671.0 - 550 + math.log2(51))
    assert findings.deliveries_per_budget == 15
    assert specs["research-alerts"].unsealed_words == 0
    assert not specs["cat-2"].gated and specs["cat-2"].unsealed_words == 181
    assert specs["cat-3"].human_approved


def test_fifty_unsealed_words_a_push_fail_with_a_readable_verdict(tmp_path):
    """A subscription with a 50-word short_text answer is over the default limit of 32."""
    result = check(write_agents(tmp_path / "agents"))
    assert not result.passed
    (channel,) = result.channels
    notes = channel.specs[0]
    assert notes.over_limit and notes.unsealed_words == 50
    assert "notes: 50 unsealed words a push" in notes.verdict
    assert "FAIL, more than 32: seal note" in notes.verdict
    assert channel.verdict.startswith("bcp:boss:reader: FAIL, notes let more than 32")
    assert notes.timing_window_s == 60 and notes.timing_bits == pytest.approx(
        math.log2(601)
    )  # 60 s on a 0.1 s grid


def test_a_sealed_question_counts_as_sealed(tmp_path):
    """`sealed: true` on a question: the field is not delivered, so it stops counting."""
    result = check(write_agents(tmp_path / "agents", sealed=", sealed: true"))
    assert result.passed
    notes = result.channels[0].specs[0]
    assert notes.unsealed_words == 0 and notes.fields[0].sealed
    assert "ok, no free text reaches the controller" in notes.verdict


def test_a_sealed_subscription_seals_every_free_text_field(tmp_path):
    """`sealed: true` on the whole subscription seals each of its questions."""
    folder = write_agents(tmp_path / "agents")
    text = (
        (folder / "boss.md")
        .read_text()
        .replace("min_interval_s: 60", "min_interval_s: 60\n        sealed: true")
    )
    (folder / "boss.md").write_text(text)
    notes = check(folder).channels[0].specs[0]
    assert notes.unsealed_words == 0 and all(f.sealed for f in notes.fields)


def test_sealed_false_or_a_typo_is_a_definition_error(tmp_path):
    """Only `sealed: true` is a seal; anything else names the file and the field."""
    folder = write_agents(tmp_path / "agents", sealed=", sealed: false")
    with pytest.raises(DefinitionError, match="boss.md"):
        load_agents(folder)


def test_timing_is_unbounded_without_a_rate_limit_and_grows_with_the_window():
    """A push with no min_interval_s or max_per_hour can come any time; a query within its TTL."""
    assert timing_bits(None, OBSERVED_RESOLUTION_S) is None
    assert timing_bits(300.0, 0.001) == pytest.approx(18.19, abs=0.01)
    assert timing_bits(300.0, 1.0) < timing_bits(300.0, 0.001)


_QUESTION = st.fixed_dictionaries(
    {
        "max_words": st.integers(1, 200),
        "expected_format": st.sampled_from(
            ["short_text", "short_list", "person_name", "email", "integer", "date", "yes_no"]
        ),
    }
)


@given(
    questions=st.lists(_QUESTION, min_size=1, max_size=6),
    sealed=st.sets(st.integers(0, 5)),
    budget=st.floats(10, 1e6),
    limit=st.integers(0, 200),
)
def test_risk_figures_hold_together(questions, sealed, budget, limit):
    """Words are the unsealed free-text words; per budget is per delivery times deliveries;
    sealing only removes words; a tighter format never saves more than there is."""
    spec = QuerySpec.model_validate(
        {
            "category": 2,
            "questions": [{"id": f"q{i}", "question": "?", **q} for i, q in enumerate(questions)],
        }
    )
    names = [f"q{i}" for i in sealed if i < len(questions)]
    common = {"budget_bits": budget, "quantum_s": 0.001, "query_ttl": 300.0}
    risk = spec_risk("query_template", "t", spec, max_unsealed_words=limit, sealed=names, **common)
    bare = spec_risk("query_template", "t", spec, max_unsealed_words=limit, **common)
    free = [
        q["max_words"]
        for i, q in enumerate(questions)
        if q["expected_format"] in {"short_text", "short_list", "person_name", "email"}
        and f"q{i}" not in names
    ]
    assert risk.unsealed_words == sum(free) <= bare.unsealed_words
    assert risk.words_per_budget == risk.deliveries_per_budget * risk.unsealed_words
    assert risk.deliveries_per_budget * (risk.bits + 1) <= budget
    assert risk.over_limit == (risk.unsealed_words > limit)
    assert risk.savings["sealing"].words == risk.unsealed_words
    assert 0 <= risk.savings["tighter"].words <= risk.unsealed_words
    assert risk.savings["tighter"].words == sum(max(0, w - TIGHT_WORDS) for w in free)
    assert ("FAIL" in risk.verdict) == risk.over_limit


def test_a_subscription_window_is_its_min_interval_or_its_hourly_share():
    """min_interval_s bounds a push's moment; else 3600 / max_per_hour seconds."""
    spec = {"category": 1, "fields": [{"name": "up", "type": "boolean"}]}
    hourly = Subscription.model_validate({"id": "s", "max_per_hour": 10, **spec})
    risk = spec_risk(
        "subscription",
        "s",
        hourly,
        budget_bits=100,
        quantum_s=1.0,
        query_ttl=300.0,
        max_unsealed_words=0,
    )
    assert risk.timing_window_s == 360.0 and not risk.over_limit
    assert risk.timing_bits == pytest.approx(math.log2(361))


def test_the_grid_costs_each_delivery_its_first_slot_and_no_grid_says_timing_is_uncharged():
    """On a grid every delivery pays at least slot 0 (2 bits), so fewer fit a budget; with
    delivery_quantum 0 timing is not charged, and the verdict says so."""
    spec = Subscription.model_validate(
        {"id": "s", "category": 1, "fields": [{"name": "up", "type": "boolean"}]}
    )
    common = {"budget_bits": 30, "query_ttl": 300.0, "max_unsealed_words": 0}
    gridded = spec_risk("subscription", "s", spec, quantum_s=0.1, **common)
    bare = spec_risk(
        "subscription", "s", spec, quantum_s=OBSERVED_RESOLUTION_S, grid=False, **common
    )
    assert gridded.deliveries_per_budget == 30 // (1 + 1 + 2)
    assert bare.deliveries_per_budget == 30 // (1 + 1)
    assert "uncharged" not in gridded.verdict
    assert "timing 13.3 bits uncharged (delivery_quantum: 0)" in bare.verdict
