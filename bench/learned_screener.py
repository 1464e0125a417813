"""A learned screener, tried as a screener peer: character and word n-grams, a linear model.

An experiment (docs/bcp.md, "Screeners"; bench/README.md has its figures): a logistic regression
over TF-IDF character n-grams (2 to 4, inside word boundaries) and word n-grams (1 and 2) of the
normalized, casefolded text, trained by :mod:`bench.screener_train` on the public corpora the
screen was tuned on. The weights are a JSON file; scoring is plain Python (no scikit-learn at run
time), so a peer that loads them costs a dictionary lookup per n-gram, well under a millisecond
for a 50-word answer.

:func:`attach` makes a screener of a peer ``system:<name>`` (:func:`serve` runs one): it answers
every ``bcp_screen_request`` with a ``bcp_screen_verdict``, ``reject`` with an ``instruction``
finding for each field that scores at or above the model's threshold, ``pass`` otherwise. The
scores go to the verdict's ``detail``, for the log only.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from peers import Message, Peer, Reply
from peers.gateway.normalize import normalize_text

__all__ = [
    "DEFAULT_WEIGHTS",
    "Model",
    "analyze",
    "attach",
    "char_ngrams",
    "prepare",
    "serve",
    "word_ngrams",
]

DEFAULT_WEIGHTS: Final = Path(__file__).resolve().parent / "learned_screener.json"
"""Where :mod:`bench.screener_train` writes the weights by default (not committed)."""

_WORD: Final = re.compile(r"(?u)\b\w\w+\b")  # scikit-learn's default token_pattern
_SPACES: Final = re.compile(r"\s\s+")


def prepare(text: str) -> str:
    """The text a model reads: normalized as the gateway does (NFKC, no invisibles), casefolded."""
    return " ".join(normalize_text(text).casefold().split())


def char_ngrams(text: str, low: int, high: int) -> list[str]:
    """scikit-learn's ``char_wb`` n-grams of ``text``: inside each word padded with spaces."""
    grams: list[str] = []
    for word in _SPACES.sub(" ", text).split():
        padded = f" {word} "
        length = len(padded)
        for n in range(low, high + 1):
            offset = 0
            grams.append(padded[offset : offset + n])
            while offset + n < length:
                offset += 1
                grams.append(padded[offset : offset + n])
            if offset == 0:  # the word is shorter than n: counted once
                break
    return grams


def word_ngrams(text: str, low: int, high: int) -> list[str]:
    """scikit-learn's ``word`` n-grams: tokens of two or more word characters, joined by a space."""
    tokens = _WORD.findall(text)
    grams: list[str] = []
    for n in range(low, high + 1):
        grams += [" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return grams


def analyze(text: str, model: Model) -> dict[str, list[str]]:
    """Both n-gram lists of prepared ``text``, by block (``char``, ``word``)."""
    return {
        "char": char_ngrams(text, *model.char_range),
        "word": word_ngrams(text, *model.word_range),
    }


@dataclass(frozen=True)
class Model:
    """The weights: for each block, ``{ngram: (idf, coefficient)}``; an intercept; a threshold."""

    blocks: dict[str, dict[str, tuple[float, float]]]
    intercept: float
    threshold: float
    char_range: tuple[int, int]
    word_range: tuple[int, int]
    meta: dict[str, Any]

    @classmethod
    def load(cls, path: Path = DEFAULT_WEIGHTS) -> Model:
        """Read the weights :mod:`bench.screener_train` wrote."""
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(
            blocks={k: {g: (w[0], w[1]) for g, w in v.items()} for k, v in data["blocks"].items()},
            intercept=data["intercept"],
            threshold=data["threshold"],
            char_range=tuple(data["char_range"]),  # type: ignore[arg-type]
            word_range=tuple(data["word_range"]),  # type: ignore[arg-type]
            meta=data.get("meta", {}),
        )

    def score(self, text: str) -> float:
        """The model's decision value for ``text``: at or above :attr:`threshold` is a finding.

        The same value as the scikit-learn pipeline's ``decision_function``: sublinear TF-IDF,
        each block normalized to unit length, then the linear model.
        """
        total = self.intercept
        for block, grams in analyze(prepare(text), self).items():
            weights = self.blocks[block]
            values = []
            for gram, count in Counter(grams).items():
                if (entry := weights.get(gram)) is not None:
                    values.append(((1 + math.log(count)) * entry[0], entry[1]))
            norm = math.sqrt(math.fsum(v * v for v, _ in values))
            if norm:
                total += math.fsum(v * c for v, c in values) / norm
        return total

    def flags(self, text: str) -> bool:
        """Whether ``text`` scores at or above the threshold."""
        return self.score(text) >= self.threshold

    def flags_any(self, texts: Iterable[str]) -> bool:
        """Whether any of ``texts`` (the fields of one answer) is flagged."""
        return any(self.flags(text) for text in texts)


def attach(peer: Peer, model: Model) -> None:
    """Make ``peer`` (a ``system:<name>`` screener) answer each ``bcp_screen_request`` by ``model``.

    Connect the peer after this; the verdict goes to ``system:gateway`` before the request's
    reply, as docs/bcp.md's example does.
    """

    async def screen(message: Message) -> Reply:
        request = message.content
        findings, scores = [], []
        for text in request["texts"]:
            score = model.score(text["raw"])
            scores.append(f"{text['field']}={score:.2f}")
            if score >= model.threshold:
                findings.append({"code": "instruction", "field": text["field"]})
        verdict = {
            "screen_id": request["screen_id"],
            "verdict": "reject" if findings else "pass",
            "findings": findings,
            "detail": f"learned screener: {', '.join(scores)}"[:200],
        }
        await peer.send("system:gateway", "bcp_screen_verdict", verdict)
        return Reply(True, "taken")

    peer.handle("bcp_screen_request", screen)


async def serve(url: str, name: str, token: str, model: Model) -> None:  # pragma: no cover
    """Run the model as screener peer ``system:<name>`` until cancelled.

    Name it in a channel's ``screeners`` (docs/bcp.md, "Screeners") and make its token with
    ``bcpbus peers add system:<name>``.
    """
    peer = Peer(url, f"system:{name}", token)
    attach(peer, model)
    async with peer:
        await asyncio.Event().wait()
