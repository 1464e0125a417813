"""The public API: what the packages export is there and documented."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import bus
import peers
import schemas
from bus.core import errors as bus_errors

REFUSALS = (
    "AlreadyInitialized",
    "AuditUnavailable",
    "AuthenticationFailed",
    "ContentNotKept",
    "DuplicateMessage",
    "EpochNotKept",
    "Forbidden",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "LimitExceeded",
    "MethodNotFound",
    "NotInitialized",
    "ParseError",
    "RemoteError",
    "ShuttingDown",
    "SubscriptionNotFound",
)
"""The bus's error classes, each with an SDK twin under peers.RequestRefused."""

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
        "RequestRefused",
        "backoff",
        *REFUSALS,
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


@pytest.mark.parametrize("name", REFUSALS)
def test_each_bus_refusal_is_a_peer_error_and_still_the_bus_class(name):
    """peers.X is a RequestRefused (so a PeerError) and bus.core.errors.X, with X's code."""
    exception = getattr(peers, name)
    bus_class = getattr(bus_errors, name)
    assert issubclass(exception, peers.RequestRefused) and issubclass(exception, peers.PeerError)
    assert issubclass(exception, bus_class) and exception.code == bus_class.code


def test_every_bus_error_code_has_its_refusal():
    """No error class of the bus is left without its SDK twin."""
    defined = {
        name
        for name in bus_errors.__all__
        if isinstance(getattr(bus_errors, name), type)
        and issubclass(getattr(bus_errors, name), bus_errors.BusError)
        and name != "BusError"
    }
    assert defined == set(REFUSALS)


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
