"""The form of a text that screening matches its phrases on: tricks on its key words undone.

A reader who wants an injection past a list of phrases writes "i g n o r e", "1gn0re" or
"ignroe"; a model still reads all three as "ignore". :func:`fold_for_screening` takes the
casefolded, normalized text (:func:`~peers.gateway.normalize.normalize_text`) and puts a
:data:`KEY_WORDS` word back wherever one of these hides it:

1. spaced letters: a run of single letters separated by one space or one of ``. - _ *``
   ("i g n o r e", "i.g.n.o.r.e") is joined when the joined letters are a key word, and so
   is a word split by hyphens or underscores ("i-nstruction") when the joined word is one, or
   a typo of one;
2. leetspeak: a word of letters mixed with digits, ``@`` or ``$`` is read with ``0 1 3 4 5 7
   @ $`` as ``o i e a s t a s`` when that gives a key word;
3. typos: a word that is one edit (a letter inserted, dropped, replaced, or two neighbours
   swapped) from a key word of six letters or more becomes that key word, unless it is itself
   an English word of the shipped vocabulary (:func:`~peers.gateway.bits.vocabulary_rank`):
   "precious" stays "precious" although it is one edit from "previous".

Nothing else changes, so the folded text is only ever matched, never shown. Each step is one
pass of a regular expression with bounded repetition and dictionary look-ups: linear in the
text's length.
"""

from __future__ import annotations

import re
import string
from functools import cache
from typing import Final

from peers.gateway.bits import vocabulary_rank

__all__ = ["KEY_WORDS", "fold_for_screening"]

KEY_WORDS: Final = frozenset(
    """
    ignore disregard forget override bypass instructions instruction previous prior above
    earlier preceding original initial prompt prompts system directives directive guidelines
    restrictions restricted unrestricted jailbreak jailbroken developer pretend roleplay
    unfiltered uncensored character persona respond response responses answer answers reply
    output assistant chatgpt openai language model execute command commands reveal password
    credentials secret everything ethical ethics policies policy filters comply obey
    """.split()
)
"""The words whose disguises are undone: those the screen's phrases are made of."""

_MIN_TYPO_LENGTH: Final = 6
_LEET: Final = str.maketrans("013457@$", "oieastas")
_SPACED: Final = re.compile(r"\b(?:[a-z][ ._*-]){3,30}[a-z]\b")
_SPLIT: Final = re.compile(r"\b[a-z]{1,12}(?:[-_]{1,3}[a-z]{1,12}){1,3}\b")
_TOKEN: Final = re.compile(r"[a-z0-9@$]{4,40}")


@cache
def _typos() -> dict[str, str]:
    """Every non-word one edit from a long key word, mapped to it (ambiguous ones dropped)."""
    found: dict[str, str | None] = {}
    for word in KEY_WORDS:
        if len(word) < _MIN_TYPO_LENGTH:
            continue
        for variant in _edits(word):
            if variant in KEY_WORDS or vocabulary_rank(variant) is not None:
                continue
            found[variant] = word if found.get(variant, word) == word else None
    return {variant: word for variant, word in found.items() if word is not None}


def _edits(word: str) -> set[str]:
    letters = string.ascii_lowercase
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    return {
        *(a + b[1:] for a, b in splits if b),
        *(a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1),
        *(a + c + b[1:] for a, b in splits if b for c in letters),
        *(a + c + b for a, b in splits for c in letters),
    }


def _join_spaced(match: re.Match[str]) -> str:
    joined = re.sub(r"[ ._*-]", "", match[0])
    return joined if joined in KEY_WORDS else match[0]


def _join_split(match: re.Match[str]) -> str:
    joined = re.sub(r"[-_]", "", match[0])
    return joined if joined in KEY_WORDS or _typos().get(joined) else match[0]


def _fix_token(match: re.Match[str]) -> str:
    token = match[0]
    if token in KEY_WORDS:
        return token
    if not token.isalpha():
        plain = token.translate(_LEET)
        return plain if plain in KEY_WORDS and plain.isalpha() else token
    if len(token) < _MIN_TYPO_LENGTH - 1 or vocabulary_rank(token) is not None:
        return token
    return _typos().get(token, token)


def fold_for_screening(text: str) -> str:
    """Return casefolded ``text`` with disguised :data:`KEY_WORDS` written plainly.

    Args:
        text: normalized and casefolded text, bounded in length.
    """
    if " " in text or any(c in text for c in "._*-"):
        text = _SPACED.sub(_join_spaced, text)
    if "-" in text or "_" in text:
        text = _SPLIT.sub(_join_split, text)
    return _TOKEN.sub(_fix_token, text)
