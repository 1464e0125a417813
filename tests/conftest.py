"""Settings for the whole suite: Hypothesis without its per-example deadline.

Hypothesis fails a property test whose single example takes longer than 200 ms, and says the
timing was unreliable when a rerun is fast. That measures the machine, not the property: the
suite runs on two processes (README's Development) beside real subprocesses, on shared CI
machines, and an example that waits for a core exceeds any fixed deadline now and then. Every
property keeps its examples and its assertions; only the timing check goes. A test that means
to bound time says so with its own timeout (``peers.testing.scaled``).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

__all__: list[str] = []

# Loaded here, before any test module is imported, so that each test's own @settings(...)
# starts from this profile and keeps what it sets (max_examples) on top of it.
settings.register_profile("bcpbus", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("bcpbus")
