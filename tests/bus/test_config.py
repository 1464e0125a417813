"""Tests for bus/ops/config.py: the serve config file, its limits section and read_section."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import ConfigDict

from bus.ops.config import (
    DEFAULT_MAX_FETCH_MESSAGES,
    DEFAULT_MAX_FRAME_BYTES,
    ConfigError,
    Count,
    Limits,
    Seconds,
    ServeConfig,
    read_section,
)


def load(tmp_path: Path, text: str) -> ServeConfig:
    path = tmp_path / "bcpbus.yaml"
    path.write_text(text)
    return ServeConfig.load(path)


def test_an_empty_file_is_the_defaults(tmp_path):
    """A config file with nothing in it gives the defaults, with its name as source."""
    config = load(tmp_path, "# nothing yet\n")
    assert config.limits == Limits()
    assert config.port == ServeConfig().port
    assert config.source == str(tmp_path / "bcpbus.yaml")


def test_keys_set_fields_and_paths_are_relative_to_the_file(tmp_path):
    """Each key sets its field; relative paths are taken from the file's folder."""
    config = load(
        tmp_path,
        "host: 0.0.0.0\nport: 0\ndb: data/bus.db\npolicy: /etc/policy.yaml\n"
        "gateway: {query_ttl: 5}\nlimits: {max_frame_bytes: 1000, process_timeout: 5}\n",
    )
    assert (config.host, config.port) == ("0.0.0.0", 0)
    assert config.db == tmp_path / "data/bus.db"
    assert config.policy == Path("/etc/policy.yaml")
    assert config.gateway == {"query_ttl": 5}
    assert config.limits.max_frame_bytes == 1000
    assert config.limits.process_timeout == 5.0
    assert config.limits.max_connections == Limits().max_connections


def test_null_turns_a_limit_off(tmp_path):
    """`null` under limits: turns that limit off; the others keep their defaults."""
    config = load(tmp_path, "limits:\n  max_frame_bytes: null\n  dedup_window: null\n")
    assert config.limits.max_frame_bytes is None
    assert config.limits.dedup_window is None
    assert config.limits.max_subscriptions == Limits().max_subscriptions


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "limits:\n  max_frame_bytes: -1\n",
            "bcpbus.yaml: limits.max_frame_bytes: must not be",
        ),
        ("limits:\n  max_frame_byte: 1\n", "limits.max_frame_byte: unknown key; expected one of"),
        ("limits:\n  max_frame_bytes: 1.5\n", "max_frame_bytes: expected a whole number, got 1.5"),
        ("limits:\n  max_frame_bytes: '10'\n", "max_frame_bytes: expected a whole number"),
        ("limits:\n  max_frame_bytes: true\n", "max_frame_bytes: expected a whole number"),
        ("limits:\n  process_timeout: .inf\n", "limits.process_timeout: Input should be a finite"),
        ("limits: 3\n", "bcpbus.yaml: limits: expected a mapping with keys dedup_max_ids"),
        ("gateway: [a]\n", "bcpbus.yaml: gateway: expected a mapping"),
        (
            "prot: 1\n",
            "bcpbus.yaml: prot: unknown key; expected one of agents_dir, audit, certfile, "
            "cluster, db",
        ),
        ("port: '8765'\n", "bcpbus.yaml: port: expected a whole number, got '8765'"),
        ("port: 70000\n", "bcpbus.yaml: port: Input should be less than or equal to 65535"),
        ("host: 1\n", "bcpbus.yaml: host: expected a string, got 1"),
        ("db: null\n", "bcpbus.yaml: db: expected a string, got None"),
        ("port: 1\nport: 2\n", "bcpbus.yaml: not valid YAML at line 2: duplicate key 'port'"),
        ("- port\n", "bcpbus.yaml: expected a mapping with keys agents_dir"),
    ],
)
def test_bad_config_names_file_and_key(tmp_path, text, error):
    """A bad config file is a ConfigError naming the file, the key's path and the fix."""
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    assert str(caught.value).startswith(str(tmp_path / "bcpbus.yaml"))
    assert error in str(caught.value)


def test_an_unreadable_file_is_a_config_error(tmp_path):
    """A missing config file is a ConfigError naming it."""
    with pytest.raises(ConfigError, match="nope.yaml: cannot read config"):
        ServeConfig.load(tmp_path / "nope.yaml")


def test_from_mapping_checks_like_load(tmp_path):
    """from_mapping applies the same checks to YAML parsed elsewhere."""
    config = ServeConfig.from_mapping({"limits": {"max_frame_bytes": 5}}, base=tmp_path, source="s")
    assert config.limits.max_frame_bytes == 5
    assert config.limits.max_connections is not None
    assert Limits().max_frame_bytes == DEFAULT_MAX_FRAME_BYTES
    with pytest.raises(ConfigError, match="^s: limits.max_frame_bytes: must not be negative"):
        ServeConfig.from_mapping({"limits": {"max_frame_bytes": -5}}, base=tmp_path, source="s")


@dataclass(frozen=True)
class Section:
    __pydantic_config__ = ConfigDict(extra="forbid")
    count: Count = 1
    seconds: Seconds | None = 2.0


def test_read_section_builds_its_dataclass():
    """read_section returns the dataclass with the keys the section sets."""
    assert read_section(Section, {"seconds": None}, "f: s") == Section(seconds=None)
    assert read_section(Section, {}, "f: s") == Section()


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({"cout": 1}, "f.yaml: s.cout: unknown key; expected one of count, seconds"),
        ({"count": None}, "f.yaml: s.count: expected a whole number, got None"),
        ({"seconds": -1}, "f.yaml: s.seconds: must not be negative"),
        ([1], "f.yaml: s: expected a mapping with keys count, seconds"),
    ],
)
def test_read_section_errors_start_with_where(value, error):
    """read_section's errors start with ``where`` and go on with the key's path."""
    with pytest.raises(ConfigError) as caught:
        read_section(Section, value, "f.yaml: s")
    assert str(caught.value).startswith(error)


@pytest.mark.parametrize("value", [0, None, 1.5])
def test_max_fetch_messages_is_always_on_and_positive(tmp_path, value):
    """max_fetch_messages cannot be turned off or set to zero: one answer must stay bounded."""
    assert Limits().max_fetch_messages == DEFAULT_MAX_FETCH_MESSAGES
    with pytest.raises(ConfigError, match="limits.max_fetch_messages"):
        ServeConfig.from_mapping(
            {"limits": {"max_fetch_messages": value}}, base=tmp_path, source="s"
        )


def test_audit_section_paths_are_relative_to_the_file(tmp_path):
    """The chain's key file and head file are read relative to the config; '-' is stdout."""
    config = load(tmp_path, "audit:\n  key_file: keys/log.key\n  head: heads.txt\n")
    assert config.audit.key_file == str(tmp_path / "keys/log.key")
    assert config.audit.head == str(tmp_path / "heads.txt")
    assert load(tmp_path, "audit:\n  head: '-'\n  head_every_rows: 5\n").audit.head == "-"
    signed = load(tmp_path, "audit:\n  signing_key: k/s.key\n  checkpoints: cp\n  sign: false\n")
    assert signed.audit.signing_key == str(tmp_path / "k/s.key")
    assert signed.audit.checkpoints == str(tmp_path / "cp") and signed.audit.sign is False
    with pytest.raises(ConfigError, match="audit.head_every_rows"):
        load(tmp_path, "audit:\n  head_every_rows: 0\n")
