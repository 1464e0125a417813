import math

import pytest
from hypothesis import given, strategies as st

from peers.gateway.bits import BITS_PER_WORD, field_bits, question_bits, spec_bits, text_bits
from schemas.bcp import QuerySpec, Question, SpecField

# BCP §"Category 1: Structured Primitives", wire format example.
SEED_CAT1 = {
    "category": 1,
    "fields": [
        {"name": "is_urgent", "type": "boolean"},
        {"name": "sentiment", "type": "enum", "values": ["positive", "neutral", "negative"]},
        {"name": "confidence", "type": "integer", "min": 1, "max": 5},
        {"name": "category", "type": "enum", "values": ["billing", "technical", "legal", "other"]},
    ],
}

# BCP Subscriptions, the research-findings subscription.
SEED_CAT2 = {
    "category": 2,
    "questions": [
        {"id": "q1", "question": "Topic?", "max_words": 10, "expected_format": "short_text"},
        {"id": "q2", "question": "Finding?", "max_words": 50, "expected_format": "short_text"},
        {"id": "q3", "question": "Relevance?", "max_words": 1, "expected_format": "integer"},
    ],
}


def test_boolean_is_one_bit():
    """A boolean field costs exactly 1 bit."""
    assert field_bits(SpecField(name="b", type="boolean")) == 1.0


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 256])
def test_enum_is_log2_of_its_values(count):
    """An enum of N values costs log2(N) bits; a single value costs nothing."""
    field = SpecField(name="e", type="enum", values=tuple(f"v{i}" for i in range(count)))
    assert field_bits(field) == pytest.approx(math.log2(count))


@pytest.mark.parametrize(
    ("low", "high", "bits"),
    [(1, 5, math.log2(5)), (0, 1, 1.0), (7, 7, 0.0), (-128, 127, 8.0), (0, 2**32 - 1, 32.0)],
)
def test_integer_is_log2_of_its_range(low, high, bits):
    """An integer in [min, max] costs log2(max - min + 1) bits."""
    assert field_bits(SpecField(name="i", type="integer", min=low, max=high)) == bits


def test_seed_cat1_example_is_about_6_9_bits():
    """The BCP spec's Cat-1 example totals ~6.9 bits: 1 + log2(3) + log2(5) + 2."""
    bits = spec_bits(QuerySpec.model_validate(SEED_CAT1))
    assert bits == pytest.approx(1 + math.log2(3) + math.log2(5) + 2)
    assert round(bits, 1) == 6.9


def test_seed_cat2_subscription_is_exactly_671_bits():
    """A 10 + 50 + 1 word Cat-2 spec is exactly 671.0 bits, as the Subscriptions spec says."""
    assert spec_bits(QuerySpec.model_validate(SEED_CAT2)) == 671.0


def test_text_is_eleven_bits_per_word():
    """Text costs 11 bits per allowed word."""
    assert BITS_PER_WORD == 11
    assert text_bits(5) == 55.0
    question = Question(id="q", question="?", max_words=30, expected_format="short_list")
    assert question_bits(question) == 330.0


def test_cat3_summary_costs_its_word_limit():
    """A Cat-3 summary of 100 words costs 1,100 bits (BCP: "~1,100 bits")."""
    spec = QuerySpec(category=3, directive="Summarize.", max_words=100)
    assert spec_bits(spec) == 1100.0


def test_default_max_words_is_charged():
    """A Cat-2 spec's top-level max_words is charged for each question that omits its own."""
    spec = QuerySpec.model_validate(
        {
            "category": 2,
            "max_words": 4,
            "questions": [
                {"id": "a", "question": "?", "expected_format": "date"},
                {"id": "b", "question": "?", "expected_format": "date", "max_words": 2},
            ],
        }
    )
    assert spec_bits(spec) == 66.0


def test_same_as_question_is_charged_in_full():
    """A redundant same_as question costs its own words: the reader still writes it."""
    spec = QuerySpec.model_validate(
        {
            "category": 2,
            "questions": [
                {"id": "a", "question": "?", "max_words": 3, "expected_format": "person_name"},
                {
                    "id": "b",
                    "question": "?",
                    "max_words": 3,
                    "expected_format": "person_name",
                    "same_as": "a",
                },
            ],
        }
    )
    assert spec_bits(spec) == 66.0


@given(st.lists(st.integers(min_value=1, max_value=2000), min_size=1, max_size=32))
def test_cat2_cost_is_eleven_times_the_word_total(limits):
    """Any Cat-2 spec costs exactly 11 bits times the sum of its word limits."""
    questions = [
        {"id": f"q{i}", "question": "?", "max_words": n, "expected_format": "short_text"}
        for i, n in enumerate(limits)
    ]
    spec = QuerySpec.model_validate({"category": 2, "questions": questions})
    assert spec_bits(spec) == float(11 * sum(limits))


@given(st.integers(-(2**53) + 1, 2**53 - 1), st.integers(0, 2**40))
def test_integer_bits_grow_with_the_range(low, width):
    """An integer field's bits are log2 of its range size, so a wider range never costs less."""
    high = min(low + width, 2**53 - 1)
    narrow = field_bits(SpecField(name="i", type="integer", min=low, max=low))
    wide = field_bits(SpecField(name="i", type="integer", min=low, max=high))
    assert narrow == 0.0
    assert wide == pytest.approx(math.log2(high - low + 1))
