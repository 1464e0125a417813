"""Anomaly screening of BCP text answers: prompt-shaped language, pointers, code, hidden data.

BCP §"Category 2 Validation": answers "that contain instruction-like language, URLs, or code
should be flagged". Screening is a heuristic, not the defence (the word limit, the formats and, for
Cat-3, a human are); it exists to catch the obvious and to put a visible mark on the rest. The
channel's ``anomaly_action`` decides what a finding does: ``reject`` fails the answer, ``review``
sends it to a human, ``flag`` delivers it with the findings listed.

What is looked for, by :class:`~schemas.bcp.AnomalyCode`:

- ``invisible`` and ``bidi``: on the *raw* text, because normalization removes these characters
  and their presence is itself the signal;
- ``mixed_script``, ``encoded`` (base64, hex, Morse) and ``email`` on the normalized text;
- ``instruction``, ``url``, ``code`` and ``markup``: the rules of :mod:`peers.gateway.patterns`
  on the *folded* text: normalized (NFKC, invisible characters gone, so that fullwidth letters
  or a zero-width space inside "ignore" hide nothing), casefolded, and with spaced, leetspeak
  and misspelled key words written plainly (:mod:`peers.gateway.folding`); then, when no
  instruction rule matched, the prompt-vocabulary count of :mod:`peers.gateway.cues`.

The rules aim at language addressed to an AI or shaped like a prompt, not at words that
ordinary research prose uses ("instead", "please", "you must" alone are not findings). Details
are written here and never quote the answer, so they are safe to show to a controller or a
human. ``python -m bench containment`` measures what the screen catches and what it spares on
public corpora; docs/bcp.md has the figures and what the screen cannot catch.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Final

from peers.gateway.cues import reads_like_a_prompt
from peers.gateway.folding import fold_for_screening
from peers.gateway.normalize import BIDI_CONTROLS, is_invisible, normalize_text
from peers.gateway.patterns import CODE, INSTRUCTION, MARKUP, URL
from schemas.bcp import Anomaly, AnomalyCode

__all__ = ["ANOMALY_WORDS", "ENCODED_RUN_MIN", "for_controller", "screen"]

ENCODED_RUN_MIN: Final = 32
"""Shortest base64 or hex run reported as ``encoded`` (a 128-bit hash is 32 hex digits)."""

_EMAIL: Final = re.compile(r"(?<![\w.%+-])[a-z0-9._%+-]+@[a-z0-9-]+(?:\.[a-z0-9-]+)+")

# Maximal runs of base64/base64url characters; the class test below tells data from words.
_B64_PIECE_MIN: Final = 20
_B64_RUN: Final = re.compile(rf"[A-Za-z0-9+/_-]{{{ENCODED_RUN_MIN},}}={{0,2}}")
_MORSE: Final = re.compile(r"(?:(?<!\S)[.\-–—]{1,7}(?:\s{1,3}(?:/\s{1,3})?|/)){12}")
_HEX_RUN: Final = re.compile(
    rf"(?<![0-9A-Za-z])(?:0x)?[0-9a-fA-F]{{{ENCODED_RUN_MIN},}}(?![0-9A-Za-z])"
)


def screen(raw: str, *, field: str | None = None, allow_email: bool = False) -> list[Anomaly]:
    """Return what screening finds in ``raw``, at most one :class:`Anomaly` per code.

    Args:
        raw: the reader's text as it arrived; bound its length first (this walks it a few
            times and normalizes it).
        field: the question id or ``summary`` to attach to each finding.
        allow_email: the answer's format is ``email``: an address is the answer, not a finding.

    Returns:
        The findings in the order of :class:`~schemas.bcp.AnomalyCode`; empty when nothing was
        found. Apply the channel's ``anomaly_action`` to a non-empty list.
    """
    found: dict[AnomalyCode, str] = {}
    _scan_characters(raw, found)
    # Normalize line by line: the phrases are matched without the tricks normalization undoes,
    # and a role marker ("system:") is still at the start of its line.
    lines = [line for line in map(normalize_text, raw.splitlines()) if line]
    text = " ".join(lines)
    folded = fold_for_screening("\n".join(lines).casefold())
    _scan_scripts(text, found)
    for code, rules in (
        (AnomalyCode.INSTRUCTION, INSTRUCTION),
        (AnomalyCode.URL, URL),
        (AnomalyCode.CODE, CODE),
        (AnomalyCode.MARKUP, MARKUP),
    ):
        for pattern, detail in rules:
            if pattern.search(folded):
                found[code] = detail
                break
    if AnomalyCode.INSTRUCTION not in found and reads_like_a_prompt(folded):
        found[AnomalyCode.INSTRUCTION] = "reads like a prompt to a model"
    if not allow_email and _EMAIL.search(folded):
        found[AnomalyCode.EMAIL] = "contains an e-mail address"
    if encoded := _encoded(text):
        found[AnomalyCode.ENCODED] = encoded
    return [
        Anomaly(code=code, detail=found[code], field=field) for code in AnomalyCode if code in found
    ]


def _scan_characters(raw: str, found: dict[AnomalyCode, str]) -> None:
    if raw.isascii() and raw.isprintable():
        return
    for index, char in enumerate(raw):
        if char in BIDI_CONTROLS:
            code = AnomalyCode.BIDI
        elif is_invisible(char):
            code = AnomalyCode.INVISIBLE
        else:
            continue
        if code not in found:
            found[code] = f"{_describe(char)} at index {index}"
        if len(found) == 2:
            return


def _describe(char: str) -> str:
    return f"U+{ord(char):04X} {unicodedata.name(char, 'unnamed character')}"


def _scan_scripts(text: str, found: dict[AnomalyCode, str]) -> None:
    # Homoglyphs: Cyrillic "а" inside a Latin word survives NFKC and defeats phrase matching.
    # Greek is left out on purpose: "α-synuclein" or "TNF-α" are ordinary research words.
    if text.isascii():
        return
    for word in text.split():
        scripts = {_script(c) for c in word if c.isalpha()}
        if {"LATIN", "CYRILLIC"} <= scripts:
            found[AnomalyCode.MIXED_SCRIPT] = "a word mixes Latin and Cyrillic letters"
            return


@lru_cache(maxsize=4096)
def _script(char: str) -> str:
    return unicodedata.name(char, "").partition(" ")[0]


def _encoded(text: str) -> str | None:
    if _MORSE.search(text):
        return "contains Morse code"
    for match in _HEX_RUN.finditer(text):
        run = match[0].removeprefix("0x")
        if len(run) >= ENCODED_RUN_MIN and any(c.isdigit() for c in run):
            return f"contains a run of {len(run)} hex digits"
    for match in _B64_RUN.finditer(text):
        run = match[0]
        classes = (
            any(c.islower() for c in run),
            any(c.isupper() for c in run),
            any(c.isdigit() for c in run),
            any(c in "+/=" for c in run),
        )
        # Data mixes at least three classes in long unbroken stretches; hyphenated words
        # ("COVID-19-related-hospitalization-rates") mix classes only in short pieces.
        longest = max(len(piece) for piece in re.split(r"[-_]", run))
        if sum(classes) >= 3 and longest >= _B64_PIECE_MIN:
            return f"contains a run of {len(run)} base64-like characters"
    return None


ANOMALY_WORDS: Final[Mapping[AnomalyCode, str]] = {
    AnomalyCode.INSTRUCTION: "language addressed to a model",
    AnomalyCode.URL: "a URL or a domain name",
    AnomalyCode.CODE: "code or shell syntax",
    AnomalyCode.MARKUP: "markup: tags, entities or Markdown links",
    AnomalyCode.EMAIL: "an e-mail address",
    AnomalyCode.ENCODED: "a long run of encoded data",
    AnomalyCode.INVISIBLE: "invisible characters, removed",
    AnomalyCode.BIDI: "bidirectional control characters, removed",
    AnomalyCode.MIXED_SCRIPT: "a word mixing Latin and Cyrillic letters",
    AnomalyCode.UNSCREENED: "no usable verdict from a screener",
}
"""What a controller is told of each finding: the gateway's fixed words for its code."""


def for_controller(anomaly: Mapping[str, Any]) -> dict[str, Any]:
    """Return a finding (an :class:`Anomaly` as JSON) as a controller may see it: its code and
    field, with :data:`ANOMALY_WORDS` for its detail.

    A finding's own detail is for the log and the approver: it can carry what the reader chose
    (a code point and its name, an index, a run's length), and nothing the reader writes but
    the charged answer may reach the controller.
    """
    code = AnomalyCode(anomaly["code"])
    view: dict[str, Any] = {"code": code.value, "detail": ANOMALY_WORDS[code]}
    if anomaly.get("field") is not None:
        view["field"] = anomaly["field"]
    return view
