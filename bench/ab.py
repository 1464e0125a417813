"""Compare this tree's bus with another tree's, interleaved: ``python -m bench.ab OTHER_TREE``.

Scenario 1 (``bench.delivery``, the bus only) at one window, run alternately from each tree in
pairs, in ABBA order (other, this; this, other; ...), so that both see the same machine. Each
run is a child ``python -c`` started in its tree, so ``bench``, ``bus`` and ``peers`` are that
tree's (and the children it starts get ``PYTHONPATH`` to it, see :mod:`bench.common`). Make the
other tree with ``git worktree add /tmp/base COMMIT``; remove it with ``git worktree remove``.
``--this TREE`` compares two other trees, e.g. a change of the past against its parent;
``--fanout N`` runs scenario 4 (``bench.fanout``: one publisher, N subscribers) instead, and
reports deliveries/s and server CPU µs a delivery;
``--transport picows`` serves this tree's bus with picows (``python -m bench.ab . --transport
picows`` compares the two transports on one tree).

Prints each run, then per tree the median msgs/s and server CPU µs/msg, and the median (min-max)
of the per-pair ratios this/other.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]

THIS = Path(__file__).resolve().parent.parent

_DRIVER = """
import asyncio, json, sys, tempfile
from pathlib import Path
from bench import delivery
window, count = int(sys.argv[1]), int(sys.argv[2])
extra = {"transport": sys.argv[3]} if len(sys.argv) > 3 else {}
options = delivery.Options(
    reps=1, windows=(window,), count=count, warmup=min(1000, count), **extra
)
one = getattr(delivery, "one", None) or delivery._one  # trees before 2026-11-27 name it _one
async def main():
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        return await one("bus", Path(tmp), options)
print(json.dumps(asyncio.run(main())[str(window)]))
"""

_FANOUT_DRIVER = """
import asyncio, json, sys, tempfile
from pathlib import Path
from bench import fanout
window, count, subscribers = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
options = fanout.Options(
    reps=1, subscribers=subscribers, windows=(window,), count=count, warmup=min(50, count)
)
async def main():
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        return await fanout._one("bus", Path(tmp), options)
figures = asyncio.run(main())[str(window)]
figures["msgs_per_s"] = figures.pop("deliveries_per_s")  # the rate ab.py reports
print(json.dumps(figures))
"""


def _run(
    tree: Path, window: int, count: int, transport: str | None, fanout: int | None = None
) -> dict[str, float]:
    if fanout is not None:
        command = [_FANOUT_DRIVER, str(window), str(count), str(fanout)]
    else:
        command = [_DRIVER, str(window), str(count), *([] if transport is None else [transport])]
    done = subprocess.run(
        [sys.executable, "-c", *command],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the run in {tree} failed:\n{done.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def _spread(values: Sequence[float], digits: int = 0) -> str:
    return (
        f"{statistics.median(values):,.{digits}f} "
        f"({min(values):,.{digits}f}-{max(values):,.{digits}f})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n")[0])
    parser.add_argument("other", type=Path, help="the other tree (a git worktree)")
    parser.add_argument(
        "--this", type=Path, default=THIS, help="the tree to compare (default: this checkout)"
    )
    parser.add_argument("--pairs", type=int, default=6, help="runs of each tree (default 6)")
    parser.add_argument("--window", type=int, default=64, help="sendMessage calls in flight")
    parser.add_argument("--count", type=int, default=20_000, help="messages measured per run")
    parser.add_argument(
        "--transport",
        choices=("websockets", "picows"),
        help="this tree's bus's serve --transport (the other tree's keeps its default); with "
        "the other tree this one, it compares the transports",
    )
    parser.add_argument(
        "--fanout",
        type=int,
        metavar="N",
        help="run the fan-out scenario with N subscribers (rates are then deliveries/s and "
        "CPU is per delivery; --count is messages, each delivered N times)",
    )
    args = parser.parse_args(argv)
    if args.fanout is not None and args.transport is not None:
        parser.error("--fanout runs each tree's bus as it serves by default: drop --transport")
    trees = {"other": args.other.resolve(), "this": args.this.resolve()}
    runs: dict[str, list[dict[str, float]]] = {"other": [], "this": []}
    unit, each = ("msgs", "msg") if args.fanout is None else ("deliveries", "delivery")
    for pair in range(args.pairs):
        for name in ("other", "this") if pair % 2 == 0 else ("this", "other"):
            transport = args.transport if name == "this" else None
            figures = _run(trees[name], args.window, args.count, transport, args.fanout)
            runs[name].append(figures)
            print(
                f"pair {pair + 1} {name}: {figures['msgs_per_s']:,.0f} {unit}/s, "
                f"{figures['server_cpu_us']:.0f} us/{each}, p50 {figures['p50_ms']:.1f} ms; "
                f"load average {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    for name, tree in trees.items():
        msgs = [f["msgs_per_s"] for f in runs[name]]
        cpu = [f["server_cpu_us"] for f in runs[name]]
        served = f", --transport {args.transport}" if name == "this" and args.transport else ""
        print(
            f"{name} ({tree}{served}): {unit}/s {_spread(msgs)}; "
            f"server CPU us/{each} {_spread(cpu)}"
        )
    pairs = list(zip(runs["this"], runs["other"], strict=True))
    msgs_ratio = [a["msgs_per_s"] / b["msgs_per_s"] for a, b in pairs]
    cpu_ratio = [a["server_cpu_us"] / b["server_cpu_us"] for a, b in pairs if b["server_cpu_us"]]
    print(f"this/other {unit}/s per pair: {_spread(msgs_ratio, 3)}")
    if cpu_ratio:
        print(f"this/other CPU/{each} per pair: {_spread(cpu_ratio, 3)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
