"""The process-wide reservation map (spec §6, §3.1).

A reservation is one in-flight attempt this process made since the last scheduler snapshot
(``node/set-priority``).  A node's estimated load is the scheduler's ``pending`` plus its
``gpuPressure`` plus the live reservations counted against the current snapshot generation.
Applying a newer snapshot supersedes every earlier reservation (the scheduler's ``pending``
already includes that work), so a later release of such a reservation is dropped: a node's
count never goes below zero.

Everything here is pure and O(1) per operation; the map is shared by every facade.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs

__all__ = ["NodeLoad", "Reservation", "ReservationMap", "parsePriority"]


@attrs.frozen
class NodeLoad:
    """The scheduler's view of one node's load in a ``node/set-priority`` snapshot."""

    pending: int
    gpuPressure: float


_ZERO_LOAD = NodeLoad(0, 0.0)


def _isInt(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _isNumber(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value)


def parsePriority(raw: object) -> tuple[int, tuple[str, ...], dict[str, NodeLoad]]:
    """Validate ``node/set-priority`` params into ``(generation, order, load)``.

    ``raw`` is ``{generation: int, order: [nodeId], load?: {nodeId: {pending: int,
    gpuPressure: number}}}``; unknown fields are ignored, ``load`` may be absent and may
    omit listed nodes.  Booleans are not numbers and non-finite numbers are refused.  A
    wrong shape raises ``ValueError`` whose message names the field, never its value.
    """
    if not isinstance(raw, Mapping):
        raise ValueError("params: expected an object")
    generation = raw.get("generation")
    if not _isInt(generation):
        raise ValueError("generation: expected an integer")
    assert isinstance(generation, int)
    order = raw.get("order")
    if not isinstance(order, list):
        raise ValueError("order: expected a list of node ids")
    for i, nodeId in enumerate(order):
        if not isinstance(nodeId, str):
            raise ValueError(f"order[{i}]: expected a string")
    rawLoad = raw.get("load", {})
    if rawLoad is None:
        rawLoad = {}
    if not isinstance(rawLoad, Mapping):
        raise ValueError("load: expected an object")
    load: dict[str, NodeLoad] = {}
    for nodeId, entry in rawLoad.items():
        if not isinstance(nodeId, str):
            raise ValueError("load: expected string keys")
        if not isinstance(entry, Mapping):
            raise ValueError("load entry: expected an object")
        pending = entry.get("pending")
        if not _isInt(pending):
            raise ValueError("load entry pending: expected an integer")
        pressure = entry.get("gpuPressure")
        if not _isNumber(pressure):
            raise ValueError("load entry gpuPressure: expected a finite number")
        assert isinstance(pending, int) and isinstance(pressure, int | float)
        load[nodeId] = NodeLoad(pending, float(pressure))
    return generation, tuple(order), load


class Reservation:
    """One claim on a node, stamped with the snapshot generation it is counted against.

    ``nodeId`` is ``None`` once released; a released reservation stays released
    (``moveTo`` on it does nothing).  ``generation`` is the generation current when the
    claim was (re)taken; ``None`` means "before any snapshot".
    """

    __slots__ = ("_map", "generation", "nodeId")

    def __init__(self, reservations: ReservationMap, nodeId: str, generation: int | None) -> None:
        self._map = reservations
        self.nodeId: str | None = nodeId
        self.generation: int | None = generation

    def moveTo(self, nodeId: str) -> None:
        """Move the claim to ``nodeId``: drop the old one as ``release`` would, claim anew."""
        current = self.nodeId
        if current is None:
            return
        m = self._map
        if current == nodeId and self.generation == m.generation:
            return
        m._drop(current, self.generation)
        m._add(nodeId)
        self.nodeId = nodeId
        self.generation = m.generation

    def release(self) -> None:
        """Release the claim; idempotent, and a no-op for a claim a newer snapshot superseded."""
        current = self.nodeId
        if current is None:
            return
        self.nodeId = None
        self._map._drop(current, self.generation)

    def __repr__(self) -> str:
        return f"<Reservation node={self.nodeId!r} generation={self.generation!r}>"


class ReservationMap:
    """The process-wide scheduler snapshot plus reservations this process took since it."""

    def __init__(self) -> None:
        self.generation: int | None = None
        self.order: tuple[str, ...] = ()
        # Replaced (never mutated) when an applied snapshot changes the order, so its
        # identity marks a version (candidates.orderCandidates caches on it).
        self.rank: Mapping[str, int] = {}
        self._load: dict[str, NodeLoad] = {}
        self._loadSorted: list[tuple[float, int, str]] | None = None
        self._counts: dict[str, int] = {}
        self._total = 0

    def applyPriority(
        self, generation: int, order: Sequence[str], load: Mapping[str, NodeLoad]
    ) -> bool:
        """Apply a scheduler snapshot if it is newer than the last applied; report whether it was.

        A redelivered or older generation changes nothing (live reservations survive); a
        newer one supersedes every reservation taken before it.  A node id repeated in
        ``order`` keeps its first position.
        """
        if self.generation is not None and generation <= self.generation:
            return False
        newOrder = tuple(order)
        if self.generation is None or newOrder != self.order:
            # An unchanged order keeps its rank object, so cached orderings stay valid.
            rank: dict[str, int] = {}
            for position, nodeId in enumerate(newOrder):
                rank.setdefault(nodeId, position)
            self.rank = rank
        self.generation = generation
        self.order = newOrder
        self._load = dict(load)
        self._loadSorted = None
        self._counts = {}
        self._total = 0
        return True

    def reorder(self, order: Sequence[str]) -> None:
        """Change the listed order and nothing else (a standalone fleet reload): the
        generation, the scheduler's load and the live reservations stay as they are."""
        newOrder = tuple(order)
        if newOrder == self.order:
            return
        rank: dict[str, int] = {}
        for position, nodeId in enumerate(newOrder):
            rank.setdefault(nodeId, position)
        self.rank = rank
        self.order = newOrder
        self._loadSorted = None

    def loadSorted(self) -> list[tuple[float, int, str]]:
        """Listed nodes as ``(pending + gpuPressure, rank, nodeId)``, ascending; do not mutate.

        Computed once per applied snapshot (empty before any).
        """
        result = self._loadSorted
        if result is None:
            result = [(self.baseLoad(nodeId), r, nodeId) for nodeId, r in self.rank.items()]
            result.sort()
            self._loadSorted = result
        return result

    def isListed(self, nodeId: str) -> bool:
        """Whether the scheduler lists ``nodeId``; every node counts before any snapshot."""
        return self.generation is None or nodeId in self.rank

    def baseLoad(self, nodeId: str) -> float:
        """The scheduler's part of the estimate: ``pending + gpuPressure`` (0 if not given)."""
        load = self._load.get(nodeId, _ZERO_LOAD)
        return load.pending + load.gpuPressure

    def estimatedLoad(self, nodeId: str) -> float:
        """``pending + gpuPressure`` plus live reservations counted against this generation."""
        load = self._load.get(nodeId, _ZERO_LOAD)
        return (load.pending + load.gpuPressure) + self._counts.get(nodeId, 0)

    def reservedCount(self, nodeId: str) -> int:
        """Live reservations on ``nodeId`` counted against the current generation."""
        return self._counts.get(nodeId, 0)

    def countsNow(self) -> Mapping[str, int]:
        """The live reservation counts of the current generation, by node id (read only;
        a node holding none is absent).  Valid until the next reservation change."""
        return self._counts

    def reserve(self, nodeId: str) -> Reservation:
        """Take a claim on ``nodeId`` stamped with the current generation."""
        self._add(nodeId)
        return Reservation(self, nodeId, self.generation)

    def totalReserved(self) -> int:
        """Live reservations over all nodes."""
        return self._total

    def byNode(self) -> dict[str, int]:
        """A copy of the live reservation count per node (empty when idle)."""
        return dict(self._counts)

    def _add(self, nodeId: str) -> None:
        counts = self._counts
        counts[nodeId] = counts.get(nodeId, 0) + 1
        self._total += 1

    def _drop(self, nodeId: str, generation: int | None) -> None:
        if generation != self.generation:
            return  # superseded by a newer snapshot: its work is in the scheduler's pending
        counts = self._counts
        count = counts.get(nodeId, 0)
        if count <= 0:
            return
        if count == 1:
            del counts[nodeId]
        else:
            counts[nodeId] = count - 1
        self._total -= 1
