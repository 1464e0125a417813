"""The activity log: rows, the chain, checkpoints, the database thread, audit queries."""

__all__: list[str] = []
