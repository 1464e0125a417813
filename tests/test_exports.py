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
        "ConnectFailed",
        "Controller",
        "FetchPage",
        "Handler",
        "InvalidURL",
        "MalformedMessage",
        "Message",
        "Peer",
        "PeerClosed",
        "PeerError",
        "PeerTimeout",
        "QueryFailed",
        "Reader",
        "Reply",
        "backoff",
    }
    for name in peers.__all__:
        assert getattr(peers, name) is not None


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("ConnectFailed", ConnectionError),
        ("InvalidURL", ValueError),
        ("MalformedMessage", ValueError),
        ("PeerClosed", ConnectionError),
        ("PeerTimeout", TimeoutError),
        ("QueryFailed", Exception),
    ],
)
def test_the_sdk_raises_one_tree(name, builtin):
    """Each SDK exception derives from PeerError and from the builtin older code catches."""
    exception = getattr(peers, name)
    assert issubclass(exception, peers.PeerError) and issubclass(exception, builtin)


def test_moved_exceptions_stay_importable_where_they_were():
    """PeerClosed and QueryFailed are still importable from peers.client and peers.bcp."""
    assert peers.client.PeerClosed is peers.PeerClosed
    assert peers.bcp.QueryFailed is peers.QueryFailed


@pytest.mark.parametrize("name", MODULES)
def test_every_module_declares_what_it_exports(name):
    """Each module has a docstring and an __all__ whose names all exist."""
    module = importlib.import_module(name)
    assert module.__doc__, f"{name} has no docstring"
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    for attribute in exported:
        assert hasattr(module, attribute), f"{name}.__all__ names {attribute!r}, which is missing"
