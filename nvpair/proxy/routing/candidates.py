"""Pure routing policy: who owns a model, in which order to try them, whom to reserve.

Spec §5 steps 1-3 and §6.  A facade's discovery snapshot is indexed once, when it arrives
(``Snapshot``), so that per-request work is a dict lookup plus work proportional to the
candidates actually examined, not to the fleet:

* ``Snapshot.owners`` returns a prebuilt tuple per normalized model; models with the same
  owners share one tuple, and so one cache;
* ``orderCandidates`` caches the scheduler-ranked order on that tuple, keyed by the
  identity of the ``rank`` mapping (``ReservationMap.rank`` is replaced, never mutated,
  when a snapshot changes the order), and a request reads it through a ``CandidateOrder``
  view that moves at most one candidate to the front without copying the rest;
* ``placeReservation`` keeps, on the same cache and per snapshot generation, the listed
  candidates sorted by the scheduler's part of their load, and stops scanning as soon as
  no later candidate can beat the best so far: only candidates holding reservations cost
  extra, and those are bounded by the requests in flight.  Before any snapshot it scans
  the candidates in order and stops at the first one holding no reservation.

Callers must treat ``rank`` mappings as immutable values.  ``placeReservation`` also takes
a plain list (scanned linearly and reordered in place).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import overload

from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.routing.reservations import ReservationMap

__all__ = [
    "EMPTY",
    "Snapshot",
    "orderCandidates",
    "placeReservation",
]


def _defaultKey(node: Node) -> tuple[bool, str]:
    return (not node.isSelf, node.id)


def _loadKey(entry: tuple[float, int, Node]) -> tuple[float, int]:
    return entry[0], entry[1]


class _Plan:
    """Per-(owners, rank) cache: the ranked order and, lazily, the load-sorted listed subset."""

    __slots__ = ("loadGeneration", "loadMap", "loadOrder", "positions", "rank", "ranked")

    def __init__(self, rank: Mapping[str, int], ranked: tuple[Node, ...]) -> None:
        self.rank = rank
        self.ranked = ranked
        self.positions = {node.id: i for i, node in enumerate(ranked)}
        self.loadMap: ReservationMap | None = None
        self.loadGeneration: int | None = None
        self.loadOrder: list[tuple[float, int, Node]] = []

    def loadOrderFor(self, reservations: ReservationMap) -> list[tuple[float, int, Node]]:
        if self.loadMap is not reservations or self.loadGeneration != reservations.generation:
            ranked = self.ranked
            listed: list[tuple[float, int, Node]]
            fleet = reservations.loadSorted()
            if self.rank is reservations.rank and len(ranked) * 8 >= len(fleet):
                # Many owners: filter the fleet-wide order (already sorted by load, then by
                # rank, which is the owners' order for listed nodes) instead of sorting.
                positions = self.positions
                listed = []
                for base, _, nodeId in fleet:
                    position = positions.get(nodeId)
                    if position is not None:
                        listed.append((base, position, ranked[position]))
            else:
                listed = [
                    (reservations.baseLoad(node.id), i, node)
                    for i, node in enumerate(ranked)
                    if reservations.isListed(node.id)
                ]
                listed.sort(key=_loadKey)
            self.loadOrder = listed
            self.loadMap = reservations
            self.loadGeneration = reservations.generation
        return self.loadOrder


class _Owners(tuple[Node, ...]):
    """An owner tuple from a ``Snapshot`` index, carrying its ordering cache."""

    plan: _Plan | None = None


class CandidateOrder(Sequence[Node]):
    """The candidates of one round in the order they are tried, read from the plan's shared
    ranked tuple without copying it.

    At most one candidate (the pin, or the one a reservation chose) is moved to the front
    in place; a further move copies the order once.  So building an order and walking its
    first few candidates costs the same for three owners as for a thousand.
    """

    __slots__ = ("plan", "_ranked", "_moved")

    def __init__(self, ranked: Sequence[Node], plan: _Plan | None) -> None:
        self.plan = plan  # the cache this order can still be placed with, or None
        self._ranked: Sequence[Node] = ranked
        self._moved = 0  # index in ``_ranked`` of the node moved first (0: none moved)

    def __len__(self) -> int:
        return len(self._ranked)

    @overload
    def __getitem__(self, index: int) -> Node: ...

    @overload
    def __getitem__(self, index: slice) -> list[Node]: ...

    def __getitem__(self, index: int | slice) -> Node | list[Node]:
        if isinstance(index, slice):
            return list(self)[index]
        ranked = self._ranked
        if index < 0:
            index += len(ranked)
        if not 0 <= index < len(ranked):
            raise IndexError(index)
        moved = self._moved
        if index > moved:
            return ranked[index]
        return ranked[moved] if index == 0 else ranked[index - 1]

    def __iter__(self) -> Iterator[Node]:
        ranked = self._ranked
        moved = self._moved
        if not moved:
            yield from ranked
            return
        yield ranked[moved]
        for index in range(moved):
            yield ranked[index]
        for index in range(moved + 1, len(ranked)):
            yield ranked[index]

    def moveToFront(self, position: int) -> None:
        """Put the candidate now at ``position`` first; the others keep their order."""
        if not position:
            return
        self.plan = None
        if not self._moved and not isinstance(self._ranked, list):
            self._moved = position  # the shared tuple stays untouched
            return
        if not isinstance(self._ranked, list):
            self._ranked = list(self)
            self._moved = 0
        assert isinstance(self._ranked, list)
        self._ranked.insert(0, self._ranked.pop(position))

    def __repr__(self) -> str:
        return f"<CandidateOrder {[node.id for node in self]}>"


def toFront(ordered: Sequence[Node], position: int) -> None:
    """Move the candidate at ``position`` to the front of an order (a view or a list)."""
    if isinstance(ordered, CandidateOrder):
        ordered.moveToFront(position)
    elif position:
        assert isinstance(ordered, list)
        ordered.insert(0, ordered.pop(position))


_NO_OWNERS = _Owners()


def _rankOrder(owners: Sequence[Node], rank: Mapping[str, int]) -> tuple[Node, ...]:
    if not rank:
        return tuple(owners)
    listed = [node for node in owners if node.id in rank]
    listed.sort(key=lambda node: rank[node.id])  # stable: equal ranks keep default order
    unlisted = [node for node in owners if node.id not in rank]
    return tuple(listed + unlisted)


class Snapshot:
    """One facade's discovery snapshot, indexed for per-request owner lookup."""

    __slots__ = ("_byId", "_index", "_noSelf", "nodes", "normalize")

    def __init__(self, nodes: Sequence[Node], normalize: Callable[[str], str]) -> None:
        byId: dict[str, Node] = {}
        for node in nodes:
            byId.setdefault(node.id, node)  # a repeated id keeps its first node
        self._byId = byId
        self.normalize = normalize
        self.nodes: tuple[Node, ...] = tuple(sorted(byId.values(), key=_defaultKey))
        building: dict[str, list[Node]] = {}
        for node in self.nodes:
            for model in node.models:
                owners = building.get(normalize(model))
                if owners is None:
                    building[normalize(model)] = [node]
                elif owners[-1] is not node:  # two spellings of one model on one node
                    owners.append(node)
        # Models with the same owners share one owner tuple, and so one ordering cache.
        interned: dict[tuple[str, ...], tuple[_Owners, _Owners | None]] = {}
        index: dict[str, _Owners] = {}
        noSelf: dict[str, _Owners] = {}
        for model, found in building.items():
            key = tuple([node.id for node in found])
            entry = interned.get(key)
            if entry is None:
                stripped: _Owners | None = None
                if found[0].isSelf:
                    # Self nodes sort first, so the owners without them are a suffix.
                    skip = 1
                    while skip < len(found) and found[skip].isSelf:
                        skip += 1
                    strippedKey = key[skip:]
                    strippedEntry = interned.get(strippedKey)
                    if strippedEntry is None:
                        strippedEntry = (_Owners(found[skip:]), None)
                        interned[strippedKey] = strippedEntry
                    stripped = strippedEntry[0]
                entry = (_Owners(found), stripped)
                interned[key] = entry
            index[model] = entry[0]
            if entry[1] is not None:
                noSelf[model] = entry[1]
        self._index = index
        self._noSelf = noSelf

    def owners(self, model: str, hasLocalBackend: bool) -> tuple[Node, ...]:
        """The nodes advertising the already-normalized ``model``, in default order.

        A ``self`` node is left out when ``hasLocalBackend`` is false.
        """
        if not hasLocalBackend:
            owners = self._noSelf.get(model)
            if owners is not None:
                return owners
        return self._index.get(model, _NO_OWNERS)

    def get(self, nodeId: str) -> Node | None:
        """The node with id ``nodeId``, or ``None``."""
        return self._byId.get(nodeId)

    def __contains__(self, nodeId: object) -> bool:
        return nodeId in self._byId

    def __len__(self) -> int:
        return len(self._byId)

    def __repr__(self) -> str:
        return f"<Snapshot nodes={len(self._byId)} models={len(self._index)}>"


def _identity(model: str) -> str:
    return model


EMPTY = Snapshot((), _identity)


def _planFor(owners: Sequence[Node], rank: Mapping[str, int]) -> _Plan:
    if isinstance(owners, _Owners):
        plan = owners.plan
        if plan is None or (plan.rank is not rank and (rank or plan.rank)):
            plan = _Plan(rank, _rankOrder(owners, rank))
            owners.plan = plan
        return plan
    return _Plan(rank, _rankOrder(owners, rank))


def orderCandidates(
    owners: Sequence[Node], pin: str | None, rank: Mapping[str, int]
) -> tuple[CandidateOrder, bool]:
    """Order ``owners`` for trying them and report whether the pin applied.

    An eligible pin (an owner's id) comes first; then owners the scheduler lists, by
    ``rank`` (node id to its position in ``node/set-priority`` order); then the rest in
    their order in ``owners``.  An ineligible pin changes nothing and adds nobody.
    """
    plan = _planFor(owners, rank)
    if pin is not None:
        position = plan.positions.get(pin)
        if position is not None:
            pinned = CandidateOrder(plan.ranked, None)
            pinned.moveToFront(position)
            return pinned, True
    return CandidateOrder(plan.ranked, plan), False


def placeReservation(
    ordered: Sequence[Node], pinApplied: bool, reservations: ReservationMap
) -> Node | None:
    """Move the least-loaded scheduler-listed candidate to the front and return it.

    Nothing happens (``None``) when a pin applied or no candidate is listed.  Before any
    scheduler snapshot every candidate counts as listed.  Ties keep the current order.  The
    caller then takes ``reservations.reserve(node.id)``.
    """
    if pinApplied or not ordered:
        return None
    if reservations.generation is None:
        return _placeStandalone(ordered, reservations)
    plan: _Plan | None = ordered.plan if isinstance(ordered, CandidateOrder) else None
    if plan is not None and len(ordered) == len(plan.ranked):
        count = reservations.countsNow().get
        bestLoad = 0.0
        bestPos = -1
        best: Node | None = None
        for base, position, node in plan.loadOrderFor(reservations):
            if best is not None and (base > bestLoad or (base == bestLoad and position > bestPos)):
                break  # every later candidate has at least this load and a later position
            load = base + count(node.id, 0)
            if best is None or load < bestLoad or (load == bestLoad and position < bestPos):
                best, bestLoad, bestPos = node, load, position
        if best is None:
            return None
        if ordered[bestPos] is best:
            toFront(ordered, bestPos)
            return best
    return _placeLinear(ordered, reservations)


def _placeStandalone(ordered: Sequence[Node], reservations: ReservationMap) -> Node | None:
    # Before any snapshot every candidate is listed and its load is its reservation count,
    # so the first candidate holding none wins outright.
    counts = reservations.countsNow().get
    bestPos = 0
    bestCount = -1
    for position, node in enumerate(ordered):
        count = counts(node.id, 0)
        if bestCount < 0 or count < bestCount:
            bestPos, bestCount = position, count
            if not count:
                break
    best = ordered[bestPos]
    toFront(ordered, bestPos)
    return best


def _placeLinear(ordered: Sequence[Node], reservations: ReservationMap) -> Node | None:
    bestPos = -1
    bestLoad = 0.0
    for position, node in enumerate(ordered):
        if not reservations.isListed(node.id):
            continue
        load = reservations.estimatedLoad(node.id)
        if bestPos < 0 or load < bestLoad:
            bestPos, bestLoad = position, load
    if bestPos < 0:
        return None
    best = ordered[bestPos]
    toFront(ordered, bestPos)
    return best
