"""How much a text reads like a prompt: the vocabulary of jailbreaks, counted.

Many injections are not one phrase but a paragraph that sets up a persona and its rules ("a
fictional AI named X that answers any request, never refuses and has no guidelines"). No single
phrase of it is a finding; together they are. :func:`prompt_score` counts the distinct words of
that vocabulary in a text and :func:`reads_like_a_prompt` turns the count into a finding:

- *strong* words (2 points each): what a prompt says about a model and its rules ("prompt",
  "respond", "comply", "unfiltered", "persona", "guidelines", names like "ChatGPT");
- *weak* words (1 point each): words a prompt uses often but prose uses too ("character",
  "rules", "answer", "user", "illegal");
- the text addresses its reader: "you" or "your" (1 point each, at most 3), and imperative
  sentence openings ("Respond ...", "Stay ...", "Remember ..."; 1 point each, at most 2).

A text with at least one strong word is a finding when it addresses its reader and scores
:data:`ADDRESSED_MIN` or more, or scores :data:`THIRD_PERSON_MIN` or more without addressing
anyone. The thresholds come from ``python -m bench containment``: no benign text of its corpora
reaches them, and neither do research findings *about* AI written in the third person ("GPT-4
refused 12% of harmful prompts") up to about seven such words; a finding about jailbreaks that
uses more of their vocabulary than that is flagged, the price of catching them.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["ADDRESSED_MIN", "THIRD_PERSON_MIN", "prompt_score", "reads_like_a_prompt"]

ADDRESSED_MIN: Final = 5
"""Lowest score, with at least one strong word, of a text that addresses its reader."""
THIRD_PERSON_MIN: Final = 8
"""Lowest score, with at least one strong word, of a text that addresses no one."""
_MAX_YOU: Final = 3
_MAX_IMPERATIVES: Final = 2

_STRONG: Final = re.compile(
    r"\b(?:\w{0,20}gpt\w{0,20}|open ?ai|ai|a\.i\.|chatbot|language model|llms?|persona"
    r"|roleplay|role-play|in character|unfiltered|uncensored|unrestricted|amoral|unethical"
    r"|immoral|jailbr\w{0,10}|guidelines|content polic(?:y|ies)|polic(?:y|ies)|restrictions"
    r"|restricted|prompts?|prompted|respond|responds|responses?|comply|complies|complying"
    r"|refuse|refuses|refusal|obey|instructions?|censor\w{0,10}|filters?|filtered|limitations"
    r"|boundaries|sentient|simulate|pretend|emulate)\b"
)
_WEAK: Final = re.compile(
    r"\b(?:character|characters|story|game|role|rules?|moral(?:s|ity)?|ethic(?:s|al|ally)"
    r"|illegal|legality|harmful|offensive|explicit|inappropriate|warnings?|disclaimers?|laws"
    r"|answer(?:s|ing)?|repl(?:y|ies)|say|says|saying|write|writes|generate|provide|user|users"
    r"|mode|message|messages|questions?|format|confirm|understand|sorry|apologi[sz]e|anything"
    r"|freedom|evil|dangerous|assistant|bot|unlimited|unbound|no matter|output|requests?"
    r"|commands?|opinions?|feelings|emotions|humans?|chat|conversation|dialogue|fictional"
    r"|hypothetical|imaginary|imagine|personality|named|called|known as)\b"
)
_YOU: Final = re.compile(r"\b(?:you|your|yourself|you're|you'll|you've|u)\b")
_IMPERATIVE: Final = re.compile(
    r"(?:^|[.!?:;]\s{1,5})(?:please\s|now\s|also\s)?(?:respond|reply|answer|act|simulate"
    r"|pretend|imagine|write|generate|provide|say|tell|stay|remember|make sure|begin|start|use"
    r"|avoid|ignore|output|print|confirm|do not|don't|dont|never|always|keep|include|add|create"
    r"|give|describe|explain|list|show|let's|lets|ask|talk|speak|play|assume|become|be)\b",
    re.MULTILINE,
)


def prompt_score(folded: str) -> tuple[int, int, bool]:
    """Return ``(score, strong words, addresses its reader)`` of casefolded ``folded``."""
    strong = set(_STRONG.findall(folded))
    weak = set(_WEAK.findall(folded))
    you = min(len(_YOU.findall(folded)), _MAX_YOU)
    imperatives = min(len(_IMPERATIVE.findall(folded)), _MAX_IMPERATIVES)
    return 2 * len(strong) + len(weak) + you + imperatives, len(strong), you + imperatives > 0


def reads_like_a_prompt(folded: str) -> bool:
    """Whether casefolded ``folded`` uses enough of a prompt's vocabulary to be a finding."""
    score, strong, addressed = prompt_score(folded)
    if not strong:
        return False
    return score >= (ADDRESSED_MIN if addressed else THIRD_PERSON_MIN)
