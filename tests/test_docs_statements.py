"""What the docs state about the built-in policy is what the policy says, so that neither can
change without the other."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from bus.core.policy import Policy

ROOT = Path(__file__).resolve().parents[1]


def test_the_role_counts_in_operators_md_are_the_default_policy_s():
    """Every "N roles" that serve prints in docs/operators.md counts the built-in policy's roles."""
    text = (ROOT / "docs" / "operators.md").read_text(encoding="utf-8")
    counts = [int(n) for n in re.findall(r"\b(\d+) roles\b", text)]
    assert counts, "docs/operators.md shows serve's role count"
    assert set(counts) == {len(Policy.default().roles)}


def test_the_readme_role_table_lists_the_default_policy_s_roles():
    """The README's role table has one row per role of bus/default_policy.yaml, in its order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("| role | members | may send | may subscribe |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `([a-z_-]+)`", table, flags=re.MULTILINE)
    assert rows == list(Policy.default().roles)


def test_the_webhook_peers_file_example_subscribes_only_where_the_policy_allows():
    """Each subscription of the peers-file example in docs/http.md is one the built-in policy
    grants that peer, so the example works as printed."""
    text = (ROOT / "docs" / "http.md").read_text(encoding="utf-8")
    example = re.search(r"```yaml\n(peers:\n.*?)```", text, flags=re.DOTALL)
    assert example is not None, "docs/http.md shows a peers file"
    policy = Policy.default()
    peers = yaml.safe_load(example.group(1))["peers"]
    for client_id, entry in peers.items():
        grants = policy.grants(client_id, policy.roles_for(client_id, entry["roles"]))
        for pattern in entry["webhook"]["subscriptions"]:
            assert grants.may_subscribe(pattern), (client_id, pattern)
