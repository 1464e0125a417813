"""How peers reach the bus: WebSocket, in process, HTTP, webhooks."""

__all__: list[str] = []
