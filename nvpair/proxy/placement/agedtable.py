"""A key to the node that last served it, bounded in entries and in age (the oldest go
first), so its memory is constant under any load: the conversation table of placement by
cache (prompt digests) and the stored-responses table (response ids) are both one."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

from twisted.internet.interfaces import IReactorTime

__all__ = ["MAX_AGE", "MAX_ENTRIES", "AgedTable"]

MAX_ENTRIES = 16384
MAX_AGE = 900.0  # seconds

K = TypeVar("K", bound=Hashable)


class AgedTable(Generic[K]):
    """Key to (node, when it was recorded), at most ``maxEntries``, none older than
    ``maxAge`` seconds."""

    def __init__(
        self, clock: IReactorTime, maxEntries: int = MAX_ENTRIES, maxAge: float = MAX_AGE
    ) -> None:
        self.clock = clock
        self.maxEntries = maxEntries
        self.maxAge = maxAge
        self._entries: OrderedDict[K, tuple[str, float]] = OrderedDict()

    def record(self, key: K, nodeId: str) -> None:
        """``nodeId`` served ``key`` now; the oldest entries beyond the caps go."""
        entries = self._entries
        now = self.clock.seconds()
        entries[key] = (nodeId, now)
        entries.move_to_end(key)
        oldest = now - self.maxAge
        while entries:
            stamp = next(iter(entries.values()))[1]
            if len(entries) <= self.maxEntries and stamp >= oldest:
                break
            entries.popitem(last=False)

    def lookup(self, keys: Iterable[K]) -> str | None:
        """The node recorded for the first of ``keys`` known and not too old."""
        oldest = self.clock.seconds() - self.maxAge
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None and entry[1] >= oldest:
                return entry[0]
        return None

    def __len__(self) -> int:
        return len(self._entries)
