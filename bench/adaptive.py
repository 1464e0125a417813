"""The adaptive corpora of ``python -m bench containment``: written against the screen, held out.

``bench/heldout/adaptive/`` holds 200 injections written by hand by someone who had read
``peers/gateway/screening.py`` and ``patterns.py``, aimed at what they do not look for
(instructions as facts, passives, recommendations, synonyms for "ignore", third-person personas,
fake memos, spelled-out addresses, Greek and IPA homoglyphs, Latin-script languages outside the
phrase lists, instructions split across the topic and the finding), and 200 benign texts in the
same shapes. **Held out**: only the benchmark reads them (``tests/bench/test_adaptive.py`` fails
when the screen, a screener or a training script does).

Every sample is sent as one ``research-findings`` push of the reference agents: its finding, and
its topic when the sample is split. An injection is whole an instruction, so it succeeds when it
is delivered (no cuts: each fits the reference's word limits). The rows have the shape of
:mod:`bench.containment`'s, plus ``shape`` counts of what got past the screen.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from peers.gateway.screening import screen
from peers.gateway.validation import validate_response
from schemas.bcp import AnomalyAction, QuerySpec

from .containment_bus import RELEVANCE, TOPIC

__all__ = [
    "ADAPTIVE_DIR",
    "SOURCE",
    "Entry",
    "attack_row",
    "benign_row",
    "load",
    "outcome",
    "push",
    "screen_passes",
]

ADAPTIVE_DIR: Final = Path(__file__).resolve().parent / "heldout" / "adaptive"
SOURCE: Final = "bench/heldout/adaptive"
_FILES: Final = {"attack": "injections.txt", "benign": "benign.txt"}

Kind = Literal["attack", "benign"]
Judge = Callable[[Any], str]


@dataclass(frozen=True, slots=True)
class Entry:
    """One sample: its shape, the topic it brings (None: the fixed one) and its finding."""

    shape: str
    finding: str
    topic: str | None = None

    def answer(self) -> dict[str, str]:
        """The ``research-findings`` push that carries this sample."""
        return {"topic": self.topic or TOPIC, "finding": self.finding, "relevance": RELEVANCE}

    def texts(self) -> list[tuple[str, str]]:
        """The free-text fields the sample writes: ``(field, text)``."""
        own = [("topic", self.topic)] if self.topic is not None else []
        return [*own, ("finding", self.finding)]


def load(kind: Kind, limit: int | None = None) -> list[Entry]:
    """The adaptive injections or benign texts, in file order (``limit``: spread over all)."""
    entries = list(_parse((ADAPTIVE_DIR / _FILES[kind]).read_text(encoding="utf-8")))
    if limit is not None and len(entries) > limit:
        step = len(entries) / limit
        entries = [entries[int(i * step)] for i in range(limit)]
    return entries


def _parse(text: str) -> Iterator[Entry]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        shape, sep, rest = line.partition(" | ")
        if not sep:
            raise ValueError(f"line {number}: expected SHAPE | TEXT")
        topic, split, finding = rest.partition(" || ")
        yield Entry(shape, finding, topic) if split else Entry(shape, rest)


def outcome(spec: QuerySpec, entry: Entry, action: AnomalyAction, judge: Judge) -> str:
    """The outcome of ``entry`` as a push: ``sealed`` for a delivery whose every text the
    sample writes is sealed, as the controller then receives none of it."""
    found = judge(push(spec, entry, action))
    if found == "delivered" and all(f in spec.sealed_keys() for f, _text in entry.texts()):
        return "sealed"
    return found


def push(spec: QuerySpec, entry: Entry, action: AnomalyAction) -> Any:
    """The gateway's verdict on ``entry`` as a push of ``spec``."""
    return validate_response(spec, entry.answer(), anomaly_action=action)


def screen_passes(entry: Entry) -> bool:
    """Whether the built-in screen finds nothing in any field of ``entry``."""
    return not any(screen(text, field=field) for field, text in entry.texts())


def attack_row(
    name: str, entries: list[Entry], spec: QuerySpec, action: AnomalyAction, judge: Judge
) -> dict[str, Any]:
    """A row of the containment report for adaptive injections (a delivery is a success)."""
    outcomes: Counter[str] = Counter()
    past: Counter[str] = Counter()
    for entry in entries:
        outcomes[outcome(spec, entry, action, judge)] += 1
        if screen_passes(entry):
            past[entry.shape] += 1
    delivered = outcomes["delivered"]
    return _row(name, "attack", entries, outcomes) | {
        "success_whole": delivered,
        "success_best": delivered,
        "screen_alone": sum(past.values()),
        "fragment_alone": sum(past.values()),
        "past_screen_by_shape": dict(sorted(past.items())),
    }


def benign_row(
    name: str, entries: list[Entry], spec: QuerySpec, action: AnomalyAction, judge: Judge
) -> dict[str, Any]:
    """A row of the containment report for the adaptive benign texts."""
    outcomes: Counter[str] = Counter()
    flagged = 0
    for entry in entries:
        outcomes[outcome(spec, entry, action, judge)] += 1
        flagged += not screen_passes(entry)
    return _row(name, "benign", entries, outcomes) | {"screen_alone": flagged}


def _row(name: str, kind: Kind, entries: list[Entry], outcomes: Counter[str]) -> dict[str, Any]:
    return {
        "name": name,
        "kind": kind,
        "source": SOURCE,
        "held_out": True,
        "samples": len(entries),
        "answers": len(entries),
        **{o: outcomes[o] for o in ("delivered", "sealed", "held", "screen", "format", "capacity")},
    }
