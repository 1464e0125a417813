"""The containment report per corpus group and layer: public tuned, PyRIT held out, adaptive.

:func:`adaptive_rows` runs the hand-written adaptive corpora (:mod:`bench.adaptive`) through the
reference push, and :func:`layer_table` puts every corpus group side by side, layer by layer:
what the screen alone lets past, then where the gateway stopped each sample (the screen, the
format and length checks, the capacity check) and what was delivered. The public attack corpora
the screen was tuned on count as one group; each held-out corpus and each benign corpus is its
own row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from schemas.bcp import AnomalyAction, QuerySpec

from .adaptive import attack_row, benign_row, load
from .common import table

__all__ = ["adaptive_rows", "layer_table"]


def adaptive_rows(
    spec: QuerySpec, action: AnomalyAction, limit: int | None = None
) -> list[dict[str, Any]]:
    """The adaptive injections' and benign texts' rows, in :mod:`bench.containment`'s shape."""
    from .containment import judge  # containment imports this module at its top

    return [
        attack_row("adaptive/injections", load("attack", limit), spec, action, judge),
        benign_row("adaptive/benign", load("benign", limit), spec, action, judge),
    ]


def _groups(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[Mapping[str, Any]]]]:
    tuned = [r for r in rows if r["kind"] == "attack" and not r["held_out"]]
    groups: list[tuple[str, list[Mapping[str, Any]]]] = []
    if tuned:
        groups.append(("public attacks (tuned)", tuned))
    groups += [
        (f"{r['name']} (held out)", [r]) for r in rows if r["kind"] == "attack" and r["held_out"]
    ]
    groups += [
        (f"{r['name']} (benign{', held out' if r['held_out'] else ''})", [r])
        for r in rows
        if r["kind"] == "benign"
    ]
    return groups


def layer_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line per corpus group: past the screen alone, then stopped by each layer, delivered.

    For attacks, *past the screen* is the share with a cut the screen finds nothing in that still
    carries a complete instruction; *delivered* the share that reached the controller carrying
    one (best of 3 cuts). For benign texts, *past the screen* is the share it finds nothing in.
    The layer columns count answers (cuts), the first layer that stopped each.
    """
    headers = [
        "corpus",
        "samples",
        "past the screen alone",
        "answers",
        "stopped: screen",
        "format",
        "capacity",
        "held",
        "sealed: not delivered",
        "delivered",
        "instruction delivered",
    ]
    lines = []
    for name, group in _groups(rows):
        samples = sum(r["samples"] for r in group)
        answers = sum(r["answers"] for r in group)
        attack = group[0]["kind"] == "attack"
        past = sum(r["screen_alone"] for r in group)
        past = past if attack else samples - past
        success = sum(r["success_best"] for r in group) if attack else None
        lines.append(
            [
                name,
                samples,
                _share(past, samples),
                answers,
                *(_share(sum(r[k] for r in group), answers) for k in ("screen", "format")),
                *(_share(sum(r[k] for r in group), answers) for k in ("capacity", "held")),
                _share(sum(r.get("sealed", 0) for r in group), answers),
                _share(sum(r["delivered"] for r in group), answers),
                "-" if success is None else _share(success, samples),
            ]
        )
    return "Per corpus and layer:\n\n" + table(headers, lines)


def _share(part: int, whole: int) -> str:
    return f"{part:,} ({100.0 * part / whole:.1f}%)" if whole else "0"
