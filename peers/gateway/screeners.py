"""Screener peers: what the gateway asks them, how it reads their verdicts, and how a verdict
combines with its own screen. Pure functions; :mod:`peers.gateway.core.screens` runs the flow.

A channel may name screeners (``screeners: [system:screener-x]``): peers that judge every valid
Cat-2 and Cat-3 answer before the controller gets it, so that an operator can plug in a
detector (a model, a rule set, a service) without touching the gateway. The gateway's own
screen (:mod:`peers.gateway.screening`) still runs first; a screener can only make the outcome
stricter:

- ``pass``: nothing found.
- ``flag``: findings, which count like the gateway's own under the channel's ``anomaly_action``
  (``reject`` refuses the answer, ``review`` holds it for a human, ``flag`` delivers it with the
  codes).
- ``reject``: refuse the answer, whatever the channel's ``anomaly_action``.
- no usable verdict (:class:`Unusable`: the screener was offline, did not answer in time, or
  sent something that is not a ``bcp_screen_verdict`` about this answer): the channel's
  ``screener_failure`` decides, ``reject`` (the default) or ``review``. Both fail closed.

A refused answer goes back to its reader like any invalid answer (``validation_failed``, a
retry used), so the controller learns of it only as ``retries_exhausted``, an outcome it
already pays for (:mod:`peers.gateway.core.outcomes`). What the screener wrote reaches the
controller only as :class:`~schemas.bcp.AnomalyCode` values, on a ``flag`` channel, with a
detail the gateway writes; its own ``detail`` goes to the activity log alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from schemas.bcp import (
    Anomaly,
    AnomalyAction,
    AnomalyCode,
    BcpScreenVerdict,
    NormalizedResponse,
    QuerySpec,
    ScreenerFailure,
    ScreenFinding,
    ScreenText,
    ValidationCode,
    ValidationReason,
)

from .validation import ValidationResult

__all__ = ["ScreenerOutcome", "Unusable", "combine", "read_verdict", "screen_texts"]


@dataclass(frozen=True, slots=True)
class Unusable:
    """A screener gave no usable verdict: ``why`` it did not, and a detail for the log."""

    why: Literal["unavailable", "timeout", "malformed"]
    detail: str = ""


ScreenerOutcome = BcpScreenVerdict | Unusable
"""What one screener said about one answer, or that it said nothing usable."""


def screen_texts(
    spec: QuerySpec, raw: Mapping[str, Any], response: NormalizedResponse
) -> tuple[ScreenText, ...]:
    """Return the texts of a valid Cat-2 or Cat-3 answer to put in a ``bcp_screen_request``.

    Args:
        spec: the query's or subscription's spec.
        raw: the reader's ``response`` object as received (validation has checked it).
        response: the normalized answer, :attr:`ValidationResult.response`.
    """
    if spec.category == 3:
        return (
            ScreenText(
                field="summary",
                raw=str(raw["summary"]),
                normalized=str(response["summary"]),
                max_words=spec.max_words or 1,
            ),
        )
    return tuple(
        ScreenText(
            field=question.id,
            raw=str(raw[question.id]),
            normalized=str(response[question.id]),
            expected_format=question.expected_format,
            max_words=question.max_words,
        )
        for question in spec.questions or ()
    )


def read_verdict(content: Mapping[str, Any], fields: Iterable[str]) -> ScreenerOutcome:
    """Read a ``bcp_screen_verdict`` whose findings may name only ``fields``.

    Returns:
        The verdict, or :class:`Unusable` (``malformed``) naming the first problem: anything
        but a well-formed verdict about this answer counts as no verdict.
    """
    try:
        verdict = BcpScreenVerdict.model_validate(content)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "content"
        return Unusable("malformed", f"{where}: {first['msg']}"[:200])
    known = set(fields)
    for finding in verdict.findings:
        if finding.field is not None and finding.field not in known:
            return Unusable("malformed", f"a finding names {finding.field!r}, not a field asked")
    return verdict


def combine(
    result: ValidationResult,
    outcomes: Mapping[str, ScreenerOutcome],
    *,
    anomaly_action: AnomalyAction,
    screener_failure: ScreenerFailure,
) -> ValidationResult:
    """Return the verdict on an answer once its screeners have spoken (or failed to).

    Args:
        result: the gateway's own verdict; an accepted one (screeners judge only those).
        outcomes: each screener's outcome, by clientId, in the channel's order.
        anomaly_action: the channel's: what a ``flag`` leads to.
        screener_failure: the channel's: what an :class:`Unusable` leads to.

    Returns:
        A refused result with the reasons to tell the reader, or an accepted one, with
        ``needs_review`` when a human must look first; either way with every finding.
    """
    found = list(result.anomalies)
    reasons: list[ValidationReason] = []
    review = result.needs_review
    for screener, outcome in outcomes.items():
        if isinstance(outcome, Unusable):
            if screener_failure == "reject":
                message = (
                    f"screener {screener} gave no usable verdict ({outcome.why}); this channel "
                    "refuses unscreened answers"
                )
                reasons.append(ValidationReason(field=None, code=_UNSCREENED, message=message))
            else:
                detail = f"screener {screener} gave no usable verdict ({outcome.why})"
                found.append(Anomaly(code=AnomalyCode.UNSCREENED, detail=detail))
                review = True
            continue
        found += _anomalies(screener, outcome.findings)
        if outcome.verdict == "reject":
            reasons += _reasons(screener, "refused", outcome.findings)
        elif outcome.verdict == "flag" and anomaly_action == "reject":
            reasons += _reasons(screener, "flagged", outcome.findings)
        elif outcome.verdict == "flag" and anomaly_action == "review":
            review = True
    if reasons:
        return ValidationResult(result.category, False, None, tuple(reasons), tuple(found))
    return ValidationResult(
        result.category, True, result.response, (), tuple(found), review, result.value_bits
    )


_UNSCREENED = ValidationCode.UNSCREENED


def _anomalies(screener: str, findings: Iterable[ScreenFinding]) -> list[Anomaly]:
    # The detail is the gateway's words: a screener's own text never reaches a controller.
    detail = f"flagged by {screener}"
    return [Anomaly(code=f.code, detail=detail, field=f.field) for f in findings]


def _reasons(
    screener: str, said: str, findings: tuple[ScreenFinding, ...]
) -> list[ValidationReason]:
    """One reason per field the findings name (``None``: the whole answer)."""
    by_field: dict[str | None, list[str]] = {}
    for finding in findings:
        codes = by_field.setdefault(finding.field, [])
        if finding.code.value not in codes:
            codes.append(finding.code.value)
    if not by_field:
        by_field[None] = []
    return [
        ValidationReason(
            field=field,
            code=ValidationCode.ANOMALY,
            message=f"screener {screener} {said} it" + (f": {', '.join(codes)}" if codes else ""),
        )
        for field, codes in by_field.items()
    ]
