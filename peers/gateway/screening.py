"""Anomaly screening of BCP text answers: prompt-shaped language, pointers, code, hidden data.

BCP §"Category 2 Validation": answers "that contain instruction-like language, URLs, or code
should be flagged". Screening is a heuristic, not the defence (the word limit, the formats and, for
Cat-3, a human are); it exists to catch the obvious and to put a visible mark on the rest. The
channel's ``anomaly_action`` decides what a finding does: ``reject`` fails the answer, ``review``
sends it to a human, ``flag`` delivers it with the findings listed.

What is looked for, by :class:`~schemas.bcp.AnomalyCode`:

- ``invisible`` and ``bidi``: on the *raw* text, because normalization removes these characters
  and their presence is itself the signal;
- everything else on the *normalized* text (NFKC, invisible characters gone), so that fullwidth
  letters or a zero-width space (U+200B) inside "ignore" do not hide a phrase.

The phrase lists aim at language addressed to an AI or shaped like a prompt, not at words that
ordinary research prose uses ("instead", "please", "should" alone are not findings). Details are
written here and never quote the answer, so they are safe to show to a controller or a human.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Final

from peers.gateway.normalize import BIDI_CONTROLS, is_invisible, normalize_text
from schemas.bcp import Anomaly, AnomalyCode

__all__ = ["ENCODED_RUN_MIN", "screen"]

ENCODED_RUN_MIN: Final = 32
"""Shortest base64 or hex run reported as ``encoded`` (a 128-bit hash is 32 hex digits)."""

_AI = r"(?:ai|assistant|agent|model|llm|chatbot|gpt|chatgpt|claude|gemini|controller)"
_OVERRIDE = r"(?:ignore|disregard|forget|override|bypass)"
_EARLIER = r"(?:previous|prior|above|earlier|preceding|original|system)"

# (pattern, detail) on the casefolded normalized text, one line per raw line so that ``^``
# finds role markers. The first match of a group is its finding. Every repetition that can
# start at many places is bounded ({0,200}), so no pattern is quadratic on hostile text.
_INSTRUCTION: Final = tuple(
    (re.compile(pattern, re.MULTILINE), detail)
    for pattern, detail in (
        (
            rf"\b{_OVERRIDE}\s+(?:(?:all|any|the|your|my|of|these|those)\s+)*(?:{_EARLIER}\s+)?"
            rf"(?:instructions?|prompts?|directives?)\b"
            rf"|\b{_OVERRIDE}\s+(?:(?:all|any|the|of)\s+)*{_EARLIER}\s+\w+",
            "asks to ignore or override instructions",
        ),
        (r"\byou\s+are\s+now\b|\bfrom\s+now\s+on\b", "tries to redefine the reader's role"),
        (
            r"\b(?:act|behave|respond)\s+as\s+(?:an?\s+)?(?:unrestricted|unfiltered|different|new)\b"
            r"|\bpretend\s+(?:to\s+be|you\s+are)\b|\brole-?play\s+as\b",
            "asks to play a role",
        ),
        (
            r"\bsystem\s+(?:prompt|message|instructions?)\b|\bdeveloper\s+(?:mode|message)\b"
            r"|\bjailbreak|\bdan\s+mode\b",
            "talks about the prompt itself",
        ),
        (
            r"^\s*(?:system|assistant|user|human)\s*:|<\|[a-z_]+\|>|\[/?inst\]|<</?sys>>"
            r"|(?<!#)#{2,}\s*(?:instruction|system|response)\b",
            "contains a chat role marker",
        ),
        (
            rf"\b(?:dear|attention|hey|hello|note\s+to(?:\s+the)?)\s+{_AI}\b"
            rf"|\b(?:as\s+an?|you\s+are\s+an?)\s+(?:ai|language\s+model|llm)\b"
            rf"|(?:^|[.!?]\s+){_AI}\s*[,:]\s+\w",
            "addresses an AI",
        ),
        (
            r"\byou\s+(?:must|should|need\s+to|have\s+to|are\s+required\s+to|will\s+now)\b",
            "tells the reader of the answer what to do",
        ),
        (
            r"\b(?:new|updated|important|additional|hidden)\s+instructions?\b"
            r"|\b(?:do\s+not|don't|never)\s+(?:tell|inform|mention|reveal)\b"
            r"|\bwithout\s+(?:telling|informing)\b",
            "smuggles instructions",
        ),
        (
            r"\b(?:execute|run|call|invoke)\s+(?:the\s+|this\s+)?(?:following|this|these)\s+"
            r"(?:command|code|script|tool|function)s?\b"
            r"|\b(?:send|forward|email|post|upload|reveal|leak)\s+(?:the\s+|all\s+|your\s+)?"
            r"(?:credentials|passwords?|secrets?|api\s+keys?|private\s+keys?)\b",
            "asks for an action",
        ),
    )
)

_TLD = (
    r"(?:com|net|org|io|ai|app|dev|xyz|info|biz|top|site|online|link|click|zip|mov"
    r"|ru|cn|tk|me|co|ly|gg)"
)
_URL: Final = tuple(
    (re.compile(pattern, re.MULTILINE), detail)
    for pattern, detail in (
        (r"\b[a-z][a-z0-9+.-]{1,15}://", "contains a URL with a scheme"),
        (
            r"\b(?:javascript|vbscript):|\bdata:[a-z]+/[a-z0-9.+-]+[;,]|\bfile:/",
            "contains a script, data or file URI",
        ),
        (r"(?<![\w@.-])www\d?\.[a-z0-9-]+\.", "contains a www host"),
        (r"(?<![\w@.-])(?:[a-z0-9-]+\.)+[a-z]{2,}(?::[0-9]+)?/\S", "contains a host and path"),
        (rf"(?<![\w@.-])(?:[a-z0-9-]+\.)+{_TLD}\b", "contains a domain name"),
    )
)

_CODE: Final = tuple(
    (re.compile(pattern, re.MULTILINE), detail)
    for pattern, detail in (
        (r"```|~~~", "contains a code fence"),
        (r"`[^`\n]{1,500}`", "contains inline code"),
        (r"\bdef\s+\w+\s*\(", "contains a Python definition"),
        (
            r"\bfunction\(|\bfunction\s*\w*\s*\([^)]{0,200}\)\s*\{|=>\s*\{|\b(?:var|const)\s+\w+\s*=",
            "contains JavaScript",
        ),
        (
            r"<\s*script|\beval\s*\(|\bexec\s*\(|__import__|\bos\.system|\bsubprocess\.",
            "contains code execution",
        ),
        (
            r"\bfrom\s+[\w.]+\s+import\s+\w|\bimport\s+(?:os|sys|subprocess|socket|requests)\b",
            "contains an import",
        ),
        (
            r"\$\(|\brm\s+-[rf]|\bcurl\s+(?:-|https?:)|\b(?:wget|sudo|chmod|chown|powershell)\s+\S"
            r"|\bnc\s+-[el]|\|\s*(?:ba|z)?sh\b|\b(?:ba|z)?sh\s+-c\b|&&",
            "contains shell syntax",
        ),
        (r"\b(?:drop\s+table|union\s+select|select\s+\*\s+from)\b", "contains SQL"),
    )
)

_MARKUP: Final = tuple(
    (re.compile(pattern, re.MULTILINE), detail)
    for pattern, detail in (
        (
            r"</?[a-z][a-z0-9-]{0,30}(?:\s[^<>]{0,500})?/?>|<!--|<!\[cdata\[",
            "contains an HTML or XML tag",
        ),
        (r"&(?:[a-z][a-z0-9]{1,30}|#[0-9]{1,7}|#x[0-9a-f]{1,6});", "contains a character entity"),
        (
            r"!?\[[^\]]{0,200}\]\([^)]{0,500}\)|!\[[^\]]{0,200}\]|^\[[^\]]{1,200}\]:",
            "contains a Markdown link or image",
        ),
    )
)

_EMAIL: Final = re.compile(r"(?<![\w.%+-])[a-z0-9._%+-]+@[a-z0-9-]+(?:\.[a-z0-9-]+)+")

# Maximal runs of base64/base64url characters; the class test below tells data from words.
_B64_PIECE_MIN: Final = 20
_B64_RUN: Final = re.compile(rf"[A-Za-z0-9+/_-]{{{ENCODED_RUN_MIN},}}={{0,2}}")
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
    folded = "\n".join(lines).casefold()
    _scan_scripts(text, found)
    for code, rules in (
        (AnomalyCode.INSTRUCTION, _INSTRUCTION),
        (AnomalyCode.URL, _URL),
        (AnomalyCode.CODE, _CODE),
        (AnomalyCode.MARKUP, _MARKUP),
    ):
        for pattern, detail in rules:
            if pattern.search(folded):
                found[code] = detail
                break
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
