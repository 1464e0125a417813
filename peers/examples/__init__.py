"""Example peers: the echo agent of the bootstrap flow (:mod:`peers.examples.echo`); ``js/`` holds
a BCP reader written in Node.js from the protocol reference."""

__all__: list[str] = []
