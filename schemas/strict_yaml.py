"""YAML for files an operator writes: safe, and a duplicate key is an error.

PyYAML keeps the last of two equal keys without a word. In a policy that would let a second
``reader:`` silently replace the first, in a peers file a second entry for a clientId, in an
agent definition a second ``budget_bits``. Every configuration file bcpbus reads goes through
:func:`load`.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["StrictLoader", "load"]


class StrictLoader(yaml.SafeLoader):
    """A :class:`yaml.SafeLoader` that refuses duplicate mapping keys."""


def _construct_mapping(loader: StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: list[Any] = []  # a list: keys may be unhashable, which construct_mapping reports
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.append(key)
    return loader.construct_mapping(node, deep=True)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load(text: str) -> Any:
    """Parse ``text`` like :func:`yaml.safe_load`, but raise on a duplicate key.

    Raises:
        yaml.YAMLError: the text is not YAML, or a mapping repeats a key (the message names it
            and its line).
    """
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - StrictLoader is a SafeLoader
