"""``bcpbus demo``: the whole system in one command, on the reference agents."""

from .run import run_demo

__all__ = ["run_demo"]
