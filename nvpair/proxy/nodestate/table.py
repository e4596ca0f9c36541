"""One bounded table type for per-node (or per-anything) state: at most ``bound`` entries,
the least recently touched dropped first, so state kept per key can never grow without
limit whatever a fleet, a client or an engine does."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["MAX_NODES", "BoundedTable"]

MAX_NODES = 1024
"""Nodes any per-node table keeps state for: more backends than any fleet has."""

K = TypeVar("K")
V = TypeVar("V")


class BoundedTable(Generic[K, V]):
    """A mapping of at most ``bound`` entries; ``touch`` gets or creates an entry (made by
    ``make``) and marks it most recently used, dropping the least recently used beyond the
    bound; ``get`` reads without touching."""

    __slots__ = ("bound", "make", "_entries")

    def __init__(self, make: Callable[[], V], bound: int = MAX_NODES) -> None:
        if bound < 1:
            raise ValueError("a table holds at least one entry")
        self.bound = bound
        self.make = make
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The entry of ``key``, if any (its recency unchanged)."""
        return self._entries.get(key)

    def touch(self, key: K) -> V:
        """The entry of ``key``, created if absent, now the most recently used."""
        entries = self._entries
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = self.make()
            while len(entries) > self.bound:
                entries.popitem(last=False)
        else:
            entries.move_to_end(key)
        return entry

    def pop(self, key: K) -> V | None:
        """Forget ``key``; its entry, if it had one."""
        return self._entries.pop(key, None)

    def items(self) -> Iterator[tuple[K, V]]:
        """Every entry, least recently used first."""
        return iter(list(self._entries.items()))

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._entries))
