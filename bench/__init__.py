"""Benchmarks of the bus: ``python -m bench SCENARIO``; see ``bench/README.md``.

Each scenario runs the bus (or the baseline relay) and its peers as separate processes on
127.0.0.1 and prints the medians of several repetitions with their spread.
"""

__all__: list[str] = []
