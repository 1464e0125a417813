"""Bandwidth accounting of BCP specs: how many bits an answer can carry at most.

BCP §"Bandwidth Accounting": a boolean is 1 bit, an enum of N values log2(N) bits, an integer in
``[min, max]`` log2(max - min + 1) bits, and text 11 bits per allowed word (roughly the entropy of
an English word). A spec's cost is the sum over its fields or questions; a Cat-3 summary costs its
``max_words``. The gateway charges this cost against the channel's ``budget_bits`` before the
reader is asked (a query) or before the answer is delivered (a subscription publish), so what is
charged is the most the answer could carry, not what it happened to say.

Examples from the BCP specifications: the Cat-1 example (a boolean, a 3-value enum, an integer
1..5 and a 4-value enum) costs 1 + log2(3) + log2(5) + 2 = 6.907 bits; the ``research-findings``
subscription (questions of 10, 50 and 1 words) costs 11 x 61 = 671.0 bits.
"""

from __future__ import annotations

import math
from typing import Final

from schemas.bcp import QuerySpec, Question, SpecField

__all__ = ["BITS_PER_WORD", "field_bits", "question_bits", "spec_bits", "text_bits"]

BITS_PER_WORD: Final = 11
"""BCP: "Constrained text (W words): ~W x 11 bits"."""


def field_bits(field: SpecField) -> float:
    """Return the bits of one Cat-1 field: 1, log2(len(values)) or log2(max - min + 1).

    A one-value enum or a one-value range carries nothing and costs 0.0.
    """
    if field.type == "boolean":
        return 1.0
    if field.type == "enum":
        return math.log2(len(field.values)) if field.values else 0.0
    low, high = field.bounds()
    return math.log2(high - low + 1)


def text_bits(max_words: int) -> float:
    """Return the bits of a text answer of at most ``max_words`` words."""
    return float(BITS_PER_WORD * max_words)


def question_bits(question: Question) -> float:
    """Return the bits of one Cat-2 question.

    A ``same_as`` question is charged in full: its answer must agree with another, but agreement
    is checked after normalization, so the reader still chooses its text.
    """
    return text_bits(question.max_words)


def spec_bits(spec: QuerySpec) -> float:
    """Return the bits a whole spec costs: what the gateway charges against ``budget_bits``.

    Args:
        spec: a validated spec, or any model inheriting from :class:`~schemas.bcp.QuerySpec`
            (a query request, a subscription).

    Returns:
        The sum over fields or questions; ``max_words`` x 11 for Cat-3. Exact for text (an
        integer as a float) and within float rounding for log2 terms.
    """
    if spec.category == 1:
        return math.fsum(field_bits(f) for f in spec.fields or ())
    if spec.category == 2:
        return math.fsum(question_bits(q) for q in spec.questions or ())
    return text_bits(spec.max_words or 0)
