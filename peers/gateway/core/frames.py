"""The frames the gateway sends, built through their ``schemas`` models, and their helpers."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from schemas.agents import Channel
from schemas.bcp import (
    ID_PATTERN,
    SUBSCRIPTION_ID_PATTERN,
    UNTRUSTED_NOTICE,
    AnomalyCode,
    BcpQuery,
    BcpResponseDelivery,
    BcpValidationResult,
    DeliveryBits,
    QuerySpec,
)
from schemas.common import step_down

from ..validation import ValidationResult

__all__ = [
    "anomalies",
    "codes_only",
    "delivery",
    "iso",
    "question",
    "validation_result",
    "wire",
]

_ID = re.compile(ID_PATTERN)
_SUBSCRIPTION_ID = re.compile(SUBSCRIPTION_ID_PATTERN)


def validation_result(
    ref: Mapping[str, Any],
    error: str | None,
    detail: str,
    result: ValidationResult | None = None,
    retries_left: int | None = None,
) -> BcpValidationResult:
    """Return the ``bcp_validation_result`` for a reader: success when ``error`` is None."""
    fields: dict[str, Any] = _valid_ids(ref)
    fields.update(success=error is None, detail=detail[:1000])
    if error is not None:
        fields["error"] = error
    if result is not None and result.reasons:
        fields["reasons"] = result.reasons
    if retries_left is not None:
        fields["retries_left"] = retries_left
    return BcpValidationResult(**fields)


def question(spec: QuerySpec, query_id: str, controller: str, expires_at: float) -> BcpQuery:
    """Return the ``bcp_query`` that asks a reader ``spec``; it may answer until ``expires_at``
    (seconds since the epoch, sent to the second).

    Every part was validated already (the spec and its id with the controller's request, the
    controller's name with the agent definitions), so the frame is put together from them, not
    validated again: a query's spec would otherwise be validated three times.
    """
    values = {key: value for key in _SPEC_KEYS if (value := getattr(spec, key)) is not None}
    at = datetime.fromtimestamp(expires_at, UTC).replace(microsecond=0)
    return BcpQuery.model_construct(
        query_id=query_id, controller=controller, **values, expires_at=at
    )


_SPEC_KEYS = tuple(QuerySpec.model_fields)


def delivery(
    channel: Channel,
    spec: QuerySpec,
    response: Mapping[str, Any],
    bits: DeliveryBits,
    found: list[dict[str, Any]],
    **ref: str,
) -> dict[str, Any]:
    """Return the ``bcp_response_delivery`` content for a valid answer or push.

    Cat-2 and Cat-3 content is marked ``untrusted``, with the notice and its provenance.
    ``response`` has each sealed field's :class:`~schemas.bcp.SealedValue` in place already
    (:func:`.sealed.seal`).
    ``bits`` is what it was charged; ``bandwidth_bits`` is its value's part.
    """
    content: dict[str, Any] = {
        **ref,
        "category": spec.category,
        "from_agent": channel.reader,
        "response": dict(response),
        "bandwidth_bits": round(bits.value, 3),
        "taint": step_down(channel.reader_taint),
        "channel_mode": "bcp",
        "bits": _rounded(bits),
    }
    # Only a flag channel delivers the anomalies; on review a human approved the answer.
    if found and channel.anomaly_action == "flag":
        content["anomalies"] = codes_only(spec, found)
    if spec.category >= 2:
        # Free text from a tainted reader: say so, and where it came from, in the frame itself,
        # so that a controller can keep it apart from instructions (see render_for_prompt).
        content["untrusted"] = True
        content["notice"] = UNTRUSTED_NOTICE
        content["provenance"] = {"channel": channel.topic, "reader": channel.reader, **ref}
    return wire(BcpResponseDelivery.model_validate(content))


def _rounded(bits: DeliveryBits) -> DeliveryBits:
    return DeliveryBits(
        value=round(bits.value, 3), outcome=round(bits.outcome, 3), timing=round(bits.timing, 3)
    )


_CODE_ORDER = {code.value: index for index, code in enumerate(AnomalyCode)}


def codes_only(spec: QuerySpec, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return the findings a ``flag`` channel delivers: each ``(field, code)`` once, in the
    spec's field order then the codes' order, the code as its own detail.

    Where a finding was, which character, which screener said so: none of it reaches the
    controller, as each would be a channel the reader picks (an invisible character at a chosen
    index carries its index). What remains is charged (:func:`..bits.findings_bits`).
    """
    keys = {key: index for index, key in enumerate(spec.response_keys())}
    pairs = {(f.get("field"), str(f["code"])) for f in found}
    ordered = sorted(pairs, key=lambda p: (keys.get(p[0] or "", len(keys)), _CODE_ORDER[p[1]]))
    return [
        {"code": code, "detail": code, **({"field": field} if field is not None else {})}
        for field, code in ordered
    ]


def wire(model: BaseModel) -> dict[str, Any]:
    """Return the content of a frame built through its ``schemas`` model.

    Only the fields the gateway set are sent (it sets none to null), so a frame carries the keys
    it always carried; a nested model that says ``null`` on purpose, such as a reason's
    ``field``, keeps it, as ``schemas/json`` requires.
    """
    return model.model_dump(mode="json", exclude_unset=True)


def anomalies(result: ValidationResult) -> list[dict[str, Any]]:
    """Return the anomalies ``result`` found, as JSON."""
    return [a.model_dump(mode="json", exclude_none=True) for a in result.anomalies]


def iso(seconds: float) -> str:
    """Return ``seconds`` since the epoch as RFC 3339 UTC with a ``Z``."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _valid_ids(ref: Mapping[str, Any]) -> dict[str, str]:
    # An id the reader got wrong is not echoed: the verdict's correlationId already ties it
    # to the message it answers, and the frame must match schemas/json/bcp_validation_result.
    patterns = {"query_id": _ID, "subscription_id": _SUBSCRIPTION_ID}
    return {
        key: value
        for key, value in ref.items()
        if isinstance(value, str) and patterns[key].match(value)
    }
