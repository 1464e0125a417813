"""Running a bus: configuration, credentials, reload, metrics, startup."""

__all__: list[str] = []
