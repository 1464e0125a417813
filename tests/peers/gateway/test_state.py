"""The gateway's pure bookkeeping: ledger, task escalation, push rate limits, decided approvals."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from peers.gateway.restore import load_state
from peers.gateway.state import (
    DECISION_STATUS,
    ApprovalStatus,
    Decided,
    DecidedApprovals,
    GatewayState,
    Ledger,
    Orphans,
    RateLimiter,
    TaskTracker,
)

CHANNEL = ("main", "researcher")


def test_ledger_charges_refunds_and_resets():
    """Charges add up, refunds take back, a reset starts a new session."""
    ledger = Ledger()
    assert ledger.left(CHANNEL, 10) == 10 and ledger.cat2_used(CHANNEL) == 0
    ledger.charge(CHANNEL, 4, cat2=True)
    assert ledger.used(CHANNEL) == 4 and ledger.cat2_used(CHANNEL) == 1
    assert ledger.fits(CHANNEL, 6, 10) and not ledger.fits(CHANNEL, 6.5, 10)
    ledger.refund(CHANNEL, 4, cat2=True)
    assert ledger.used(CHANNEL) == 0 and ledger.cat2_used(CHANNEL) == 0
    ledger.charge(CHANNEL, 20)
    assert ledger.left(CHANNEL, 10) == 0
    ledger.reset(CHANNEL)
    assert ledger.used(CHANNEL) == 0


@given(st.lists(st.floats(0, 100), max_size=30), st.floats(1, 2000))
def test_ledger_never_admits_past_the_budget(charges, budget):
    """Charging only what fits keeps the total within the budget."""
    ledger = Ledger()
    for bits in charges:
        if ledger.fits(CHANNEL, bits, budget):
            ledger.charge(CHANNEL, bits)
    assert ledger.used(CHANNEL) <= budget + 1e-6


def test_exact_budget_fits_despite_float_sums():
    """Three charges of 0.1 fit a 0.3-bit budget although 0.1 * 3 > 0.3 in floats."""
    ledger = Ledger()
    for _ in range(3):
        assert ledger.fits(CHANNEL, 0.1, 0.3)
        ledger.charge(CHANNEL, 0.1)


def test_task_escalation_rules():
    """A higher category needs a justification and counts against the limit."""
    tasks = TaskTracker()
    assert tasks.check(CHANNEL, None, 3, justified=False, max_escalations=0).ok
    assert tasks.category_of(CHANNEL, "t") is None and tasks.category_of(CHANNEL, None) is None
    tasks.record(CHANNEL, "t", 1)
    assert tasks.category_of(CHANNEL, "t") == 1
    assert tasks.check(CHANNEL, "t", 1, justified=False, max_escalations=0).ok
    verdict = tasks.check(CHANNEL, "t", 2, justified=False, max_escalations=1)
    assert not verdict.ok and verdict.reason == "escalation_requires_justification"
    verdict = tasks.check(CHANNEL, "t", 2, justified=True, max_escalations=1)
    assert verdict.ok and verdict.escalation
    tasks.record(CHANNEL, "t", 2)
    verdict = tasks.check(CHANNEL, "t", 3, justified=True, max_escalations=1)
    assert verdict.reason == "escalation_limit_reached"
    assert tasks.check(CHANNEL, "other", 3, justified=False, max_escalations=0).ok
    tasks.record(CHANNEL, None, 3)  # no task: nothing recorded
    tasks.record(CHANNEL, "t", 1)  # lower: no change
    assert tasks.check(CHANNEL, "t", 2, justified=False, max_escalations=0).ok


@pytest.mark.parametrize(
    ("times", "now", "interval", "per_hour", "allowed"),
    [
        ([], 0, 60, 1, True),
        ([100], 150, 60, None, False),
        ([100], 160, 60, None, True),
        ([0, 10], 20, None, 2, False),
        ([0, 10], 3601, None, 2, True),  # the first push left the hour
    ],
)
def test_rate_limits(times, now, interval, per_hour, allowed):
    """min_interval_s and max_per_hour are enforced over a sliding hour."""
    rates = RateLimiter()
    key = ("main", "researcher", "s")
    for t in times:
        rates.record(key, t)
    assert rates.allows(key, now, min_interval_s=interval, max_per_hour=per_hour) is allowed


def test_decided_approvals_keep_the_first_decision_and_forget_the_oldest():
    """The first decision of an id stands; past the bound the oldest id is forgotten."""
    decided = DecidedApprovals(max_entries=2)
    decided.remember("ap-1", Decided("rejected", "human:bob", "2026-01-01T00:00:00Z"))
    decided.remember("ap-1", Decided("approved", "human:alice", "2026-01-01T00:00:01Z"))
    decided.remember("ap-2", Decided("expired", "system:gateway", "2026-01-01T00:00:02Z", "late"))
    first = decided.get("ap-1")
    assert first is not None
    assert first.describe() == "rejected by human:bob at 2026-01-01T00:00:00Z"
    late = decided.get("ap-2")
    assert late is not None and late.describe() == "expired at 2026-01-01T00:00:02Z (late)"
    assert Decided("expired", "system:gateway", "T").describe() == "expired at T"
    decided.remember("ap-3", Decided("edited", "human:alice", "2026-01-01T00:00:03Z"))
    assert len(decided) == 2 and decided.get("ap-1") is None
    assert decided.get("ap-3") is not None and decided.get("never") is None
    with pytest.raises(ValueError):
        DecidedApprovals(max_entries=0)


def test_only_approved_and_edited_approvals_go_ahead():
    """An approval goes ahead when approved or edited, and not when pending, rejected, expired."""
    assert {s for s in ApprovalStatus if s.accepted} == {
        ApprovalStatus.APPROVED,
        ApprovalStatus.EDITED,
    }
    assert {DECISION_STATUS[d] for d in ("approve", "reject", "edit")} == {
        ApprovalStatus.APPROVED,
        ApprovalStatus.REJECTED,
        ApprovalStatus.EDITED,
    }


def test_a_first_start_loads_an_empty_state(tmp_path):
    """With no log file, or a file without the log's table, the gateway starts from nothing."""
    import sqlite3

    sqlite3.connect(tmp_path / "empty.db").close()
    for name in ("none.db", "empty.db"):
        state = load_state({("main", "researcher")}, tmp_path / name)
        assert isinstance(state, GatewayState) and state.orphans == Orphans()
        assert state.held == [] and not state.used_query_ids and not len(state.decided)


def test_a_settled_query_still_counts_as_a_cat2_query_after_a_restart(tmp_path):
    """A refund with an outcome keeps the Cat-2 count; an older refund without one gives it back."""
    import json
    import sqlite3

    db = tmp_path / "log.db"
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TABLE activity_log (id INTEGER PRIMARY KEY, ts TEXT, event TEXT, status TEXT,"
            " actor TEXT, payload_json TEXT)"
        )
        ref = {"channel": "bcp:main:researcher", "category": 2}
        for query_id, bits, extra in [
            ("q1", 90.0, {}),
            ("q1", -86.415, {"outcome": "timeout"}),
            ("q2", 90.0, {}),
            ("q2", -90.0, {}),
        ]:
            payload = {**ref, "query_id": query_id, "bits": bits, **extra}
            conn.execute(
                "INSERT INTO activity_log (ts, event, status, actor, payload_json) VALUES"
                " ('2026-11-23T07:00:00Z', 'bcp_bits_charged', 'charged', 'system:gateway', ?)",
                (json.dumps(payload),),
            )
    conn.close()
    state = load_state({CHANNEL}, db)
    assert state.ledger.used(CHANNEL) == pytest.approx(3.585)
    assert state.ledger.cat2_used(CHANNEL) == 1


def test_a_restart_knows_what_each_orphaned_query_was_charged(tmp_path):
    """An accepted query with no outcome in the log is an orphan, with the bits it was charged."""
    import json
    import sqlite3

    db = tmp_path / "log.db"
    ref = {"channel": "bcp:main:researcher", "category": 3}
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TABLE activity_log (id INTEGER PRIMARY KEY, ts TEXT, event TEXT, status TEXT,"
            " actor TEXT, payload_json TEXT)"
        )
        for event, payload in [
            ("bcp_query_accepted", {**ref, "query_id": "q1"}),
            ("bcp_bits_charged", {**ref, "query_id": "q1", "bits": 440.0}),
            ("bcp_query_accepted", {**ref, "query_id": "q2"}),
            ("bcp_bits_charged", {**ref, "query_id": "q2", "bits": 440.0}),
            ("bcp_delivered", {**ref, "query_id": "q2"}),
        ]:
            conn.execute(
                "INSERT INTO activity_log (ts, event, status, actor, payload_json) VALUES"
                " ('2026-11-23T07:00:00Z', ?, 'x', 'system:gateway', ?)",
                (event, json.dumps(payload)),
            )
    conn.close()
    orphans = load_state({CHANNEL}, db).orphans
    assert orphans.queries == [("main", "researcher", "q1")]
    assert orphans.charged == {("main", "q1"): 440.0}
