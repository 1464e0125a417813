"""What a model needs to read a BCP spec: the answer a query wants, and what a channel allows.

Pure functions over :mod:`schemas.bcp` models, used by the ``bcp_next_query`` and
``bcp_channels`` tools. A reader model that knows the exact shape of a valid answer gets it
right the first time more often, and every rejected answer costs the query one of its retries.
"""

from __future__ import annotations

from typing import Any, Final

from peers.gateway.bits import spec_bits
from peers.gateway.validation import format_hint
from schemas.agents import Channel
from schemas.bcp import QuerySpec, SpecField

__all__ = ["ANSWER_RULES", "CATEGORY_GUIDE", "answer_format", "channel_summary"]

ANSWER_RULES: Final = (
    "Answer with a JSON object that has exactly these keys: a missing or extra key fails the "
    "whole answer.",
    "Text answers: plain facts in ordinary words; no URLs, code, markup, e-mail addresses "
    "(unless the format is email) or instructions to whoever reads them.",
    "An answer that could carry more bits than the query was charged is refused as too_long: "
    "prefer common words, and spell numbers as digits.",
)
"""Rules every answer follows, as the gateway enforces them (docs/bcp.md)."""

CATEGORY_GUIDE: Final = {
    1: "typed fields: booleans, integers in [min, max], one of an enum's values",
    2: "questions with short answers of a known format and a word limit",
    3: "a summary of at most max_words words, delivered only after a human approves it",
}
"""What each category lets a controller ask."""


def answer_format(spec: QuerySpec) -> dict[str, Any]:
    """Return what a valid answer to ``spec`` looks like: each key's shape, rules, an example.

    Args:
        spec: the query's or subscription's spec (any :class:`QuerySpec` subclass).
    """
    keys: dict[str, str] = {}
    example: dict[str, Any] = {}
    spec = spec.as_spec()
    if spec.category == 1:
        for field in spec.fields or ():
            keys[field.name], example[field.name] = _field(field)
    elif spec.category == 2:
        for question in spec.questions or ():
            keys[question.id] = (
                f"a string of at most {question.max_words} words: "
                f"{format_hint(question.expected_format)}; answers: {question.question!r}"
            )
            example[question.id] = "..."
    else:
        keys["summary"] = f"a string of at most {spec.max_words} words: {spec.directive!r}"
        example["summary"] = "..."
    return {"keys": keys, "example": example, "rules": list(ANSWER_RULES)}


def _field(field: SpecField) -> tuple[str, Any]:
    if field.type == "boolean":
        return "true or false (a JSON boolean)", True
    if field.type == "integer":
        low, high = field.bounds()
        return f"a JSON integer from {low} to {high}", low
    values = list(field.values or ())
    return f"exactly one of {values}", values[0]


def channel_summary(channel: Channel) -> dict[str, Any]:
    """Return what a controller may do on ``channel``, for ``bcp_channels``."""
    return {
        "reader": channel.reader,
        "topic": channel.topic,
        "max_category": channel.max_category,
        "categories": {
            category: text for category, text in CATEGORY_GUIDE.items() if channel.allows(category)
        },
        "budget_bits": channel.budget_bits,
        "max_cat2_queries": channel.max_cat2_queries,
        "max_escalations_per_task": channel.max_escalations_per_task,
        "anomaly_action": channel.anomaly_action,
        "reader_taint": channel.reader_taint,
        "subscriptions": [
            {
                "subscription_id": subscription.id,
                "category": subscription.category,
                "bits_per_push": round(spec_bits(subscription), 3),
            }
            for subscription in channel.subscriptions
        ],
    }
