"""The public API: what the packages export is there and documented."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import bus
import peers
import schemas

MODULES = sorted(
    info.name
    for package in (bus, peers, schemas)
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
    if not info.name.endswith("__main__")
)


def test_peers_reexports_the_sdk():
    """`from peers import ...` gives the SDK's documented names."""
    assert set(peers.__all__) == {
        "Approver",
        "Controller",
        "Handler",
        "Message",
        "Peer",
        "PeerClosed",
        "QueryFailed",
        "Reader",
        "Reply",
        "backoff",
    }
    for name in peers.__all__:
        assert getattr(peers, name) is not None


@pytest.mark.parametrize("name", MODULES)
def test_every_module_declares_what_it_exports(name):
    """Each module has a docstring and an __all__ whose names all exist."""
    module = importlib.import_module(name)
    assert module.__doc__, f"{name} has no docstring"
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    for attribute in exported:
        assert hasattr(module, attribute), f"{name}.__all__ names {attribute!r}, which is missing"
