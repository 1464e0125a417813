"""Tests for bus/ops/credentials.py: the peers file, token verification and token hashing."""

from __future__ import annotations

import hashlib
import logging
import os
import stat

import pytest

from bus.ops.credentials import (
    Credentials,
    CredentialsError,
    PeerRecord,
    hash_token,
    validate_client_id,
)

posix_only = pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")

GOOD_HASH = "sha256:" + "0" * 64


@pytest.fixture
def path(tmp_path):
    return tmp_path / "peers.yaml"


def test_round_trip(path):
    """A peer added and saved loads back and verifies with its token."""
    credentials = Credentials.empty()
    token = credentials.add("agent:main", ["controller"])
    credentials.save(path)
    loaded = Credentials.load(path)
    record = loaded.verify("agent:main", token)
    assert record == PeerRecord("agent:main", ("controller",), hash_token(token))
    assert loaded.records() == credentials.records()


def test_token_is_not_stored(path):
    """The peers file holds the token's hash, never the token."""
    credentials = Credentials.empty()
    token = credentials.add("agent:main", [])
    credentials.save(path)
    text = path.read_text()
    assert token not in text
    assert hash_token(token) in text


def test_tokens_are_long_and_distinct():
    """Each token is 256 bits of randomness, different every time."""
    credentials = Credentials.empty()
    tokens = {credentials.add(f"agent:a{i}", []) for i in range(20)}
    assert len(tokens) == 20
    assert all(len(token) >= 43 for token in tokens)  # 32 bytes in URL-safe base64
    assert all(token.startswith("bcpbus_") for token in tokens)  # never an option-like "-"


@pytest.mark.parametrize(
    ("client_id", "token"),
    [
        ("agent:main", "wrong"),
        ("agent:main", ""),
        ("agent:main", None),
        ("agent:ghost", "wrong"),
        ("agent:ghost", None),
        ("agent:main", "\ud800"),  # a lone surrogate, as JSON can carry
    ],
)
def test_verify_refuses(client_id, token):
    """An unknown clientId, a missing token and a wrong token all verify as None."""
    credentials = Credentials.empty()
    credentials.add("agent:main", ["controller"])
    assert credentials.verify(client_id, token) is None


def test_verify_refuses_empty_token_even_if_stored():
    """An empty token never authenticates, even if a hand-edited file holds its hash."""
    credentials = Credentials.empty()
    credentials._records["agent:main"] = PeerRecord("agent:main", (), hash_token(""))
    assert credentials.verify("agent:main", "") is None
    assert credentials.verify("agent:main", None) is None


def test_verify_does_the_same_work_for_unknown_ids(monkeypatch):
    """verify hashes and compares in constant time whether or not the clientId exists."""
    calls = []

    def compare_digest(a: str, b: str) -> bool:
        calls.append((len(a), len(b)))
        return a == b

    monkeypatch.setattr("bus.ops.credentials.hmac.compare_digest", compare_digest)
    credentials = Credentials.empty()
    credentials.add("agent:main", [])
    credentials.verify("agent:main", "wrong")
    credentials.verify("agent:ghost", "wrong")
    credentials.verify("agent:ghost", None)
    assert calls == [(71, 71)] * 3


def test_rotation_replaces_token(path):
    """Adding an existing clientId again issues a new token and the old one stops working."""
    credentials = Credentials.empty()
    old = credentials.add("agent:main", ["controller"])
    new = credentials.add("agent:main", ["controller", "reader"])
    assert credentials.verify("agent:main", old) is None
    record = credentials.verify("agent:main", new)
    assert record is not None
    assert record.roles == ("controller", "reader")
    assert len(credentials) == 1


def test_ephemeral_is_never_saved(path):
    """A peer added with add_ephemeral verifies in memory but is not written to the file."""
    credentials = Credentials.empty()
    credentials.add("agent:main", ["controller"])
    token = credentials.add_ephemeral("system:gateway", ["gateway"])
    assert credentials.verify("system:gateway", token) is not None
    credentials.save(path)
    loaded = Credentials.load(path)
    assert "system:gateway" not in loaded
    assert "agent:main" in loaded


def test_add_after_ephemeral_is_saved(path):
    """add() on an id that was ephemeral makes it persistent."""
    credentials = Credentials.empty()
    credentials.add_ephemeral("agent:main", [])
    token = credentials.add("agent:main", [])
    credentials.save(path)
    assert Credentials.load(path).verify("agent:main", token) is not None


def test_remove():
    """remove() forgets a peer and reports whether it was there."""
    credentials = Credentials.empty()
    token = credentials.add("agent:main", [])
    credentials.add_ephemeral("system:gateway", [])
    assert credentials.remove("agent:main")
    assert credentials.remove("system:gateway")
    assert not credentials.remove("agent:main")
    assert credentials.verify("agent:main", token) is None
    assert len(credentials) == 0


def test_container_protocol():
    """Credentials support `in`, len() and list their records sorted by clientId."""
    credentials = Credentials.empty()
    credentials.add("tg:2", ["tg"])
    credentials.add("agent:main", ["controller"])
    assert "tg:2" in credentials
    assert "tg:3" not in credentials
    assert len(credentials) == 2
    assert [r.client_id for r in credentials.records()] == ["agent:main", "tg:2"]
    assert repr(credentials) == "<Credentials 2 peers>"


@pytest.mark.parametrize(
    ("client_id", "roles"),
    [
        ("agent", []),
        ("Agent:main", []),
        ("agent:main\n", []),
        ("agent:ma:in", []),
        ("agent:*", []),
        ("agent:main", "controller"),
        ("agent:main", ["Controller"]),
        ("agent:main", [""]),
    ],
)
def test_add_validates(client_id, roles):
    """add() refuses malformed clientIds and role names and stores nothing."""
    credentials = Credentials.empty()
    with pytest.raises(CredentialsError):
        credentials.add(client_id, roles)
    assert len(credentials) == 0


@posix_only
def test_saved_file_mode(path):
    """The peers file is written with mode 0600 whatever the umask and the old file's mode."""
    path.write_text("version: 1\npeers: {}\n")
    path.chmod(0o644)
    old_umask = os.umask(0)
    try:
        Credentials.empty().save(path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_save_is_atomic(path, monkeypatch):
    """A failed save leaves the old file intact and no temporary file behind."""
    credentials = Credentials.empty()
    token = credentials.add("agent:main", [])
    credentials.save(path)
    before = path.read_bytes()

    def fail(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("bus.ops.credentials.os.replace", fail)
    credentials.add("agent:other", [])
    with pytest.raises(OSError, match="disk full"):
        credentials.save(path)
    assert path.read_bytes() == before
    assert os.listdir(path.parent) == ["peers.yaml"]
    assert Credentials.load(path).verify("agent:main", token) is not None


def test_save_failure_after_temporary_file_vanished(path, monkeypatch):
    """A failed save whose temporary file is already gone still raises the original error."""

    def fail(src: str, dst: str) -> None:
        os.unlink(src)
        raise OSError("gone")

    monkeypatch.setattr("bus.ops.credentials.os.replace", fail)
    with pytest.raises(OSError, match="gone"):
        Credentials.empty().save(path)
    assert os.listdir(path.parent) == []


def test_save_leaves_no_temporary_file(path):
    """A successful save leaves only the peers file."""
    Credentials.empty().save(path)
    assert os.listdir(path.parent) == ["peers.yaml"]


def test_save_relative_path(tmp_path, monkeypatch):
    """A bare file name saves in the working directory."""
    monkeypatch.chdir(tmp_path)
    Credentials.empty().save("peers.yaml")
    assert len(Credentials.load("peers.yaml")) == 0


def test_load_missing_file_is_empty(path):
    """A missing peers file is a fresh install: no peers."""
    assert len(Credentials.load(path)) == 0


@posix_only
def test_load_warns_about_open_permissions(path, caplog):
    """Loading a peers file other users can read logs a warning saying how to fix it."""
    Credentials.empty().save(path)
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="bus.ops.credentials"):
        Credentials.load(path)
    assert "chmod 600" in caplog.text


def test_load_unreadable(tmp_path):
    """A peers file that exists but cannot be read is an error, not an empty set of peers."""
    with pytest.raises(CredentialsError, match="cannot read the peers file"):
        Credentials.load(tmp_path)


def entry(body: str) -> str:
    return f"version: 1\npeers:\n  agent:main:\n{body}"


MALFORMED = [
    ("", "f.yaml: expected a mapping"),
    ("[]", "f.yaml: expected a mapping"),
    ("version: 1\npeers: {", "f.yaml: not valid YAML"),
    ("peers: {}", "f.yaml: version: required; write `version: 1`"),
    ("version: 2\npeers: {}", "f.yaml: version: 2 is not supported; use 1"),
    ("version: '1'\npeers: {}", "f.yaml: version: '1' is not supported; use 1"),
    ("version: 1", "f.yaml: peers: expected a mapping"),
    ("version: 1\npeers: []", "f.yaml: peers: expected a mapping"),
    ("version: 1\npeers: {}\nextra: 1", "f.yaml: extra: unknown key"),
    (f"version: 1\npeers:\n  agent: {{roles: [], token_hash: '{GOOD_HASH}'}}", "invalid clientId"),
    (f"version: 1\npeers:\n  5: {{roles: [], token_hash: '{GOOD_HASH}'}}", "f.yaml: peers:"),
    ("version: 1\npeers:\n  agent:main: x", "f.yaml: peers.agent:main: expected a mapping"),
    (entry(f"    roles: []\n    token_hash: {GOOD_HASH}\n    token: x"), "agent:main.token: unk"),
    (entry(f"    token_hash: {GOOD_HASH}"), "f.yaml: peers.agent:main.roles: expected a list"),
    (entry(f"    roles: x\n    token_hash: {GOOD_HASH}"), "peers.agent:main.roles: expected"),
    (entry(f"    roles: [a, B]\n    token_hash: {GOOD_HASH}"), "peers.agent:main.roles[1]: inv"),
    (entry("    roles: []"), "f.yaml: peers.agent:main.token_hash: expected sha256:"),
    (entry("    roles: []\n    token_hash: secret"), "peers.agent:main.token_hash: expected"),
    (entry(f"    roles: []\n    token_hash: {GOOD_HASH.upper()}"), "token_hash: expected"),
    (entry(f"    roles: []\n    token_hash: {GOOD_HASH}0"), "token_hash: expected"),
    (
        f"version: 1\npeers:\n  agent:main: {{roles: [], token_hash: '{GOOD_HASH}'}}\n"
        f"  agent:main: {{roles: [], token_hash: '{GOOD_HASH}'}}\n",
        "duplicate key 'agent:main'",
    ),
    ("version: 1\npeers: {[a]: {}}", "f.yaml: not valid YAML"),
]


@pytest.mark.parametrize(("text", "error"), MALFORMED)
def test_load_malformed(tmp_path, text, error):
    """A malformed peers file fails to load with a message naming the file and field."""
    path = tmp_path / "f.yaml"
    path.write_text(text)
    with pytest.raises(CredentialsError) as caught:
        Credentials.load(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert error in str(caught.value)


def test_load_accepts_hand_written_file(path):
    """A hand-written peers file in the documented format loads."""
    path.write_text(
        "version: 1\npeers:\n"
        f'  "agent:main":\n    roles: [controller]\n    token_hash: "{hash_token("t")}"\n'
        "  tg:42: {roles: [], token_hash: " + hash_token("u") + "}\n"
    )
    credentials = Credentials.load(path)
    assert credentials.verify("agent:main", "t") is not None
    assert credentials.verify("tg:42", "u") is not None


def test_hash_token():
    """hash_token is sha256 of the UTF-8 token, prefixed with its algorithm."""
    assert hash_token("test") == "sha256:" + hashlib.sha256(b"test").hexdigest()
    assert hash_token("\ud800").startswith("sha256:")


@pytest.mark.parametrize("client_id", ["agent:main", "system:gateway", "tg:100123", "human:a.b"])
def test_validate_client_id_accepts(client_id):
    """validate_client_id returns a valid clientId unchanged."""
    assert validate_client_id(client_id) == client_id


@pytest.mark.parametrize(
    "client_id", ["", "agent", ":main", "agent:", "Agent:main", "agent:main\n", "a b:c", 5]
)
def test_validate_client_id_refuses(client_id):
    """validate_client_id explains what a clientId looks like."""
    with pytest.raises(CredentialsError, match="expected prefix:name"):
        validate_client_id(client_id)


# Tokens without a clientId (HTTP) and webhook peers


def test_identify_finds_the_peer_of_a_token_and_nothing_else(path):
    """A token names its peer; a wrong, empty, rotated or removed one names nobody."""
    credentials = Credentials.empty()
    main = credentials.add("agent:main", ["controller"])
    other = credentials.add("agent:other", [])
    assert credentials.identify(main).client_id == "agent:main"
    assert credentials.identify(other).client_id == "agent:other"
    assert credentials.identify("bcpbus_wrong") is None
    assert credentials.identify("") is None and credentials.identify(None) is None
    rotated = credentials.add("agent:main", ["controller"])
    assert credentials.identify(main) is None and credentials.identify(rotated) is not None
    credentials.save(path)
    assert Credentials.load(path).identify(rotated).client_id == "agent:main"
    credentials.remove("agent:main")
    assert credentials.identify(rotated) is None


def test_a_webhook_round_trips_through_the_file_with_its_secret(path):
    """set_webhook stores URL, secret and patterns; the file keeps them, mode 0600."""
    credentials = Credentials.empty()
    token = credentials.add("agent:hook", [])
    secret = credentials.set_webhook("agent:hook", "https://example.com/in", ["system:presence"])
    assert secret.startswith("whsec_") and len(secret) >= 40
    assert secret not in repr(credentials.identify(token))  # never in a log line
    credentials.save(path)
    loaded = Credentials.load(path).identify(token)
    assert loaded is not None and loaded.webhook is not None
    assert loaded.webhook.url == "https://example.com/in"
    assert loaded.webhook.secret == secret
    assert loaded.webhook.subscriptions == ("system:presence",)
    if os.name == "posix":
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    "url", ["ftp://example.com/x", "example.com/x", "http://", "https://a b.com/", 42]
)
def test_a_webhook_url_must_be_http_with_a_host(url):
    """Anything the bus could not POST to is refused with what a webhook URL looks like."""
    credentials = Credentials.empty()
    credentials.add("agent:hook", [])
    with pytest.raises(CredentialsError, match="webhook URL"):
        credentials.set_webhook("agent:hook", url)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("webhook", "error"),
    [
        ("{url: 'ftp://x/y', secret: whsec_0123456789abcdef}", "webhook URL"),
        ("{url: 'http://x/y', secret: short}", "webhook secret"),
        ("{url: 'http://x/y', secret: whsec_0123456789abcdef, hmm: 1}", "hmm"),
        ("{url: 'http://x/y', secret: whsec_0123456789abcdef, subscriptions: x}", "patterns"),
    ],
)
def test_a_bad_webhook_entry_names_the_field(path, webhook, error):
    """A malformed webhook in the peers file stops loading with the field named."""
    path.write_text(
        "version: 1\npeers:\n  agent:hook:\n    roles: []\n"
        f"    token_hash: {GOOD_HASH}\n    webhook: {webhook}\n"
    )
    with pytest.raises(CredentialsError, match=error):
        Credentials.load(path)
