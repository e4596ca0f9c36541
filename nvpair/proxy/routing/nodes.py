"""The nodes of a facade's discovery snapshot, as the broker announces them (spec §5, §6).

``parseNodes`` validates the ``nodes`` list of ``<engine>:discovery:nodes``; ``Node`` is one
entry.  ``candidates.Snapshot`` indexes them for routing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

__all__ = ["Node", "parseNodes"]


@attrs.frozen(slots=True)
class Node:
    """One node of a facade's discovery snapshot, as the broker announced it."""

    id: str
    isSelf: bool
    addresses: tuple[str, ...]
    models: frozenset[str]  # as advertised (not normalized)


def _stringList(value: object, field: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ValueError(f"{field}: expected a list of strings")
    for item in value:
        if not isinstance(item, str):
            raise ValueError(f"{field}: expected a list of strings")
    return tuple(value)


def parseNodes(raw: object) -> tuple[Node, ...]:
    """Validate the ``nodes`` list of ``<engine>:discovery:nodes`` into ``Node`` values.

    ``raw`` is the list itself, or the whole params object ``{nodes: [...]}``.  Each entry
    is ``{id: string, self?: bool, addresses?: [string], models: [string]}``; unknown fields
    are ignored, an absent ``self`` is false and absent ``addresses`` empty.  The id must be
    non-empty.  When an id repeats, the first entry with that id is kept and later ones are
    ignored.  A wrong shape raises ``ValueError`` naming the field, never echoing a value.
    Returned in announcement order (``Snapshot`` applies the routing order).
    """
    if isinstance(raw, Mapping):
        if "nodes" not in raw:
            raise ValueError("nodes: missing")
        raw = raw["nodes"]
    if not isinstance(raw, list):
        raise ValueError("nodes: expected a list")
    result: list[Node] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        where = f"nodes[{i}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where}: expected an object")
        nodeId = entry.get("id")
        if not isinstance(nodeId, str) or not nodeId:
            raise ValueError(f"{where}.id: expected a non-empty string")
        isSelf = entry.get("self", False)
        if not isinstance(isSelf, bool):
            raise ValueError(f"{where}.self: expected a boolean")
        addresses = _stringList(entry.get("addresses", []), f"{where}.addresses")
        if "models" not in entry:
            raise ValueError(f"{where}.models: missing")
        models = _stringList(entry["models"], f"{where}.models")
        if nodeId in seen:
            continue
        seen.add(nodeId)
        result.append(Node(nodeId, isSelf, addresses, frozenset(models)))
    return tuple(result)


# Owners split for one placement round: to order as usual, known full, breaker open.
OwnerSplit = tuple[Sequence["Node"], tuple["Node", ...], tuple["Node", ...]]
