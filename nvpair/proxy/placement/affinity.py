"""Conversation affinity (spec §11.1): keep a conversation on the node that holds its cache.

Standalone mode only (under a broker the scheduler ranks).  Each inference request on a
chat, completion or generate route gets an ``AffinityKey`` (``keys``); a later turn finds
among its prefix digests the earlier turn's whole-request digest, and with it the node that
served that turn.

``AffinityTable`` keeps only those digests (64-bit integers, never text), capped both in
entries and in age, so its memory is constant under any load.  Layered on it, the prefix
index (``prefixindex``) matches any shared leading blocks of prompt material (a tenant's
system prompt, a shared document), which whole-request digests cannot.  ``Affinity.place``
chooses by ``prefixplace.choose``: the owner holding the longest prefix (the conversation's
home breaking ties) unless it has no room while another owner does and recomputing the
difference is cheap; a new prompt family goes to the owner holding the fewest families.
The node that commits becomes the home and holds the request's blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from twisted.internet.interfaces import IReactorTime

from nvpair.proxy.nodestate.states import EngineStates
from nvpair.proxy.placement.choose import (
    RESULTS,
    Hold,
    Placed,
    choose,
    confirmedMiss,
    familyRoot,
    servedStats,
)
from nvpair.proxy.placement.keys import AffinityKey
from nvpair.proxy.placement.prefixindex import PrefixIndex
from nvpair.proxy.routing.candidates import toFront
from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.routing.reservations import ReservationMap

__all__ = ["Affinity", "AffinityTable"]

MAX_IMBALANCE = 2  # home keeps the turn while its load <= least-loaded owner's + this
MAX_ENTRIES = 16384
MAX_AGE = 900.0


def _never() -> bool:
    return False


class AffinityTable:
    """Digest to the node that last served it, bounded in entries and in age."""

    def __init__(
        self, clock: IReactorTime, maxEntries: int = MAX_ENTRIES, maxAge: float = MAX_AGE
    ) -> None:
        self.clock = clock
        self.maxEntries = maxEntries
        self.maxAge = maxAge
        self._entries: OrderedDict[int, tuple[str, float]] = OrderedDict()

    def lookup(self, digests: Iterable[int]) -> str | None:
        """The node recorded for the first of ``digests`` known and not too old."""
        entries = self._entries
        oldest = self.clock.seconds() - self.maxAge
        for digest in digests:
            entry = entries.get(digest)
            if entry is not None and entry[1] >= oldest:
                return entry[0]
        return None

    def record(self, digest: int, nodeId: str) -> None:
        """``nodeId`` served ``digest`` now; the oldest entries beyond the caps go."""
        entries = self._entries
        now = self.clock.seconds()
        entries[digest] = (nodeId, now)
        entries.move_to_end(digest)
        oldest = now - self.maxAge
        while entries:
            digest, (_, stamp) = next(iter(entries.items()))
            if len(entries) <= self.maxEntries and stamp >= oldest:
                break
            entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class Affinity:
    """The process's placement by cache: the conversation table, the prefix index, the
    engines' state when read, the ordering rule and its counts."""

    def __init__(
        self,
        clock: IReactorTime,
        maxEntries: int = MAX_ENTRIES,
        maxAge: float = MAX_AGE,
        maxImbalance: int = MAX_IMBALANCE,
        states: EngineStates | None = None,
        index: PrefixIndex | None = None,
    ) -> None:
        self.table = AffinityTable(clock, maxEntries, maxAge)
        self.index = index if index is not None else PrefixIndex()
        self.states = states
        self.maxImbalance = maxImbalance
        self.counts: dict[str, list[int]] = {}  # engine id -> a count per ``RESULTS``
        # Whether requests with different keys share prefixes (the fleet file's
        # ``share_prefixes``; read at each admission, so a reload switches it).
        self.sharesPrefixes: Callable[[], bool] = _never
        self.confirmed = [0, 0]  # requests the index expected cached: [hits, misses]

    def _count(self, engineId: str, result: Placed) -> None:
        counts = self.counts.get(engineId)
        if counts is None:
            counts = self.counts[engineId] = [0] * len(RESULTS)
        counts[result] += 1

    def place(
        self,
        ordered: Sequence[Node],
        key: AffinityKey,
        reservations: ReservationMap,
        engineId: str | None,
        model: str | None = None,
        hold: Hold = Hold.NONE,
        full: Collection[Node] = (),
    ) -> Node | None:
        """Move the request's node to the front of ``ordered`` and return it (the caller
        reserves it), by ``prefixplace.choose``.  ``engineId`` counts the outcome (None:
        not again); ``model`` is the model asked for (whether engines have it loaded);
        ``hold`` whether it may be held; ``full`` owners known full by other means than
        their engines' slots (our in-flight at a learnt limit, say).  A held request
        (``key.hold`` set: its seconds) is neither counted nor recorded: the caller holds
        it, then places it again."""
        key.hold = None
        if not ordered:
            return None
        home = self.table.lookup(key.lookups)
        index = self.index
        choice = choose(
            ordered,
            key.blocks,
            key.ends,
            key.spread,
            home,
            reservations.estimatedLoad,
            index,
            self.states,
            model,
            self.maxImbalance,
            hold=hold,
            full=full,
        )
        chosen = ordered[choice.position]
        if choice.hold:
            key.hold = choice.hold
            return chosen  # counted where it goes once let out
        if engineId is not None:
            self._count(engineId, choice.result)
        key.expect = None
        if choice.matched:
            stamp = index.stampOf(chosen.id, key.blocks[choice.matched - 1])
            if stamp is not None:
                key.expect = (chosen.id, key.ends[choice.matched - 1], stamp)
        if key.blocks:
            # Held from now on (the engine holds the prompt once it has read it): the next
            # request of this family, even one arriving before this one commits, finds it.
            index.record(chosen.id, key.blocks, key.ends, familyRoot(key.ends))
            key.placed = chosen.id
        toFront(ordered, choice.position)
        return chosen

    def served(self, key: AffinityKey, nodeId: str) -> None:
        """``nodeId`` committed this request: it is the conversation's home now, and holds
        the request's blocks (recorded when placed, again here after a failover)."""
        for digest in key.records:
            self.table.record(digest, nodeId)
        if key.expect is not None and key.expect[0] != nodeId:
            key.expect = None  # failed over: the node that served was expected nothing
        if key.blocks and key.placed != nodeId:
            self.index.record(nodeId, key.blocks, key.ends, familyRoot(key.ends))

    def ended(self, key: AffinityKey, nodeId: str, prompt: int, cached: int) -> None:
        """The engine of ``nodeId`` reported ``cached`` of ``prompt`` prompt tokens cached:
        a confirmed miss of what the index expected drops that node's stale entries.  A
        request that asked its engine not to reuse its cache (``cache_prompt: false``)
        confirms nothing: its miss says nothing of other requests' entries."""
        expect = key.expect
        key.expect = None
        if expect is None or expect[0] != nodeId or not key.confirms:
            return
        if confirmedMiss(expect[1], key.chars, prompt, cached):
            self.confirmed[1] += 1
            self.index.dropOlder(nodeId, expect[2])
        else:
            self.confirmed[0] += 1

    def status(self) -> dict[str, object]:
        """The ``/status`` view: table size and limits, the index, counts per engine."""
        index = self.index
        return {
            "entries": len(self.table),
            "maxEntries": self.table.maxEntries,
            "maxAgeSeconds": self.table.maxAge,
            "maxImbalance": self.maxImbalance,
            "counts": {
                engineId: dict(zip(RESULTS, counts, strict=True))
                for engineId, counts in sorted(self.counts.items())
            },
            "prefixIndex": {
                "blocks": len(index),
                "maxBlocks": index.maxTotal,
                "nodes": {
                    nodeId: {
                        "blocks": index.held(nodeId),
                        "bound": index.bound(nodeId),
                        "families": index.roots(nodeId),
                    }
                    for nodeId in index.nodeIds()
                },
                "expectedHits": self.confirmed[0],
                "expectedMisses": self.confirmed[1],
                "staleDropped": index.dropped,
            },
        }


def requestServed(exchange: Any, states: EngineStates, affinity: Affinity | None) -> None:
    """An exchange ended: the cached-prompt count its engine reported (if any) goes to the
    node's hit ratio and confirms or refutes what the index expected."""
    served = servedStats(exchange)
    if served is None:
        return
    nodeId, prompt, cached, promptMs = served
    states.served(nodeId, prompt, cached, promptMs)
    key = exchange.prefixKey
    if affinity is not None and key is not None:
        affinity.ended(key, nodeId, prompt, cached)
