"""The release grid and what a slot costs, without a loop or a bus."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, strategies as st

from peers.gateway.timing import max_slot, release, slot_bits


def test_slot_costs_grow_like_elias_gamma_plus_one():
    """Slot 0 is 2 bits, slots 1-2 are 4, 3-6 are 6; a push has no cap."""
    assert [slot_bits(k) for k in range(8)] == [2, 4, 4, 6, 6, 6, 6, 8]


@pytest.mark.parametrize("slots", [1, 2, 7, 1200, 3001])
def test_query_slot_costs_satisfy_kraft(slots):
    """Over every slot a query can end in, sum 2**-bits is at most 1."""
    total = math.fsum(2.0 ** -slot_bits(k, slots) for k in range(slots))
    assert total <= 1 + 1e-12


def test_push_slot_costs_satisfy_kraft():
    """Over all slots (a push has no last one) the sum of 2**-bits stays below 1."""
    assert math.fsum(2.0 ** -slot_bits(k) for k in range(1 << 16)) <= 1


def test_a_query_slot_never_costs_more_than_one_plus_log2_of_its_slots():
    """The tail is flat: 300 s on a 0.1 s grid costs at most 1 + log2(3001) bits."""
    last = max_slot(300, 0.1)
    assert last == 3000
    assert max(slot_bits(k, last + 1) for k in range(last + 1)) == pytest.approx(
        1 + math.log2(3001)
    )


@given(st.floats(0, 1e6), st.floats(0, 1000), st.floats(0.001, 10))
def test_a_release_is_the_next_grid_point_after_the_outcome(anchor, delay, quantum):
    """Whatever the delay, the release is on the grid, after the outcome, within one step."""
    outcome = anchor + delay
    r = release(anchor, outcome, quantum)
    assert outcome <= r.at + 1e-6 * max(1.0, outcome)
    assert r.at - outcome <= quantum * (1 + 1e-6) + 1e-6
    assert r.at == pytest.approx(anchor + (r.slot + 1) * quantum)
    assert r.bits == slot_bits(r.slot)


def test_no_grid_releases_at_once_and_counts_no_timing():
    """delivery_quantum 0 turns the grid off: released at once, no timing charged."""
    r = release(100.0, 103.7, 0)
    assert (r.at, r.slot, r.bits) == (103.7, 0, 0.0)


def test_a_late_slot_is_charged_as_the_last_one():
    """A query that ends after its window (the gateway was slow) pays its last slot's price."""
    r = release(0.0, 50.0, 0.1, last=99)
    assert r.slot == 500 and r.bits == slot_bits(99, 100)
