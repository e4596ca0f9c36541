"""Conversation affinity (spec §11.1): keep a conversation on the node that holds its cache.

Standalone mode only (under a broker the scheduler ranks).  Each inference request on a
chat, completion or generate route gets an ``AffinityKey`` (``keys``); a later turn finds
among its prefix digests the earlier turn's whole-request digest, and with it the node that
served that turn.

``AffinityTable`` keeps only those digests (64-bit integers, never text), capped both in
entries and in age, so its memory is constant under any load.  Layered on it, the prefix
index (``prefixindex``) matches any shared leading blocks of prompt material (a tenant's
system prompt, a shared document), which whole-request digests cannot.  ``Affinity.place``
chooses by ``choose.choose``: the owner holding the longest prefix (the conversation's
home breaking ties) unless it has no room while another owner does and recomputing the
difference is cheap; a new prompt family goes to the owner holding the fewest families.
The node that commits becomes the home and holds the request's blocks.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from twisted.internet.interfaces import IReactorTime

from nvpair.proxy.nodestate.interfaces import IEngineStates, IResidency, IRoomLedger
from nvpair.proxy.placement.agedtable import MAX_AGE, MAX_ENTRIES, AgedTable
from nvpair.proxy.placement.choose import (
    MAX_IMBALANCE,
    Choice,
    Hold,
    Owner,
    Placed,
    choose,
    confirmedMiss,
    familyRoot,
    fleetRate,
)
from nvpair.proxy.placement.keys import AffinityKey
from nvpair.proxy.placement.prefixindex import PrefixIndex
from nvpair.proxy.routing.candidates import toFront
from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.routing.reservations import ReservationMap

__all__ = ["MAX_UNREAD", "Affinity", "AffinityTable"]

MAX_UNREAD = 4096  # placements whose engine has not read their prompt yet, tracked at most


def _never() -> bool:
    return False


def _expectedWait(ledger: IRoomLedger, nodeId: str) -> float | None:
    """Seconds until one of the full ``nodeId``'s slots frees, expected: the time ours hold
    a slot there over how many it runs at once; None while either is unknown."""
    service, capacity = ledger.serviceTime(nodeId), ledger.capacity(nodeId)
    return None if service is None or not capacity else service / capacity


class AffinityTable(AgedTable[int]):
    """Prompt digest to the node that last served it (``agedtable.AgedTable``)."""


class Affinity:
    """The process's placement by cache: the conversation table, the prefix index, what it
    reads of each owner (its load, its room in the ledger, its engine's state), the
    choice, and its counts."""

    def __init__(
        self,
        clock: IReactorTime,
        reservations: ReservationMap,
        ledger: IRoomLedger | None = None,
        states: IEngineStates | None = None,
        index: PrefixIndex | None = None,
        maxEntries: int = MAX_ENTRIES,
        maxAge: float = MAX_AGE,
        residency: IResidency | None = None,
    ) -> None:
        self.table = AffinityTable(clock, maxEntries, maxAge)
        self.index = index if index is not None else PrefixIndex()
        self.reservations = reservations
        self.ledger = ledger
        self.states = states
        self.residency = residency
        self.counts: dict[str, Counter[Placed]] = {}  # per engine id (three at most)
        self.expectedHits = 0  # requests the index expected cached, confirmed by the engine
        self.expectedMisses = 0  # ... and refuted (a confirmed miss)
        # (node, index stamp) of placements not yet committed: their engine may not have
        # read the prompt, so a miss against what they recorded confirms nothing.
        self.unread: OrderedDict[tuple[str, int], None] = OrderedDict()
        # Whether requests with different keys share prefixes (the fleet file's
        # ``share_prefixes``; read at each admission, so a reload switches it).
        self.sharesPrefixes: Callable[[], bool] = _never

    def owners(self, ordered: Sequence[Node], key: AffinityKey, model: str | None) -> list[Owner]:
        """One ``choose.Owner`` record per node of ``ordered`` for the request ``key``."""
        nodes = list(ordered)  # one pass: ``ordered`` may be a lazy view
        load = self.reservations.estimatedLoad
        loads = [load(node.id) for node in nodes]
        least = min(loads)
        matches = self.index.matches(key.blocks)
        home = self.table.lookup(key.lookups)
        roots = self.index.roots
        ledger, states = self.ledger, self.states
        residency = None if model is None else self.residency  # its per-model slots
        wanted = model or ""
        records = []
        for node, value in zip(nodes, loads, strict=True):
            nodeId = node.id
            free = None if ledger is None else ledger.free(nodeId)
            room = value <= least + MAX_IMBALANCE if free is None else free > 0
            if room and residency is not None and residency.modelFull(nodeId, wanted):
                room, free = False, 0  # the model's own slots there are all ours (Ollama)
            wait = None if room or ledger is None else _expectedWait(ledger, nodeId)
            loaded = prefill = None
            moves = False
            if states is not None:
                loaded = None if model is None else states.modelLoaded(nodeId, model)
                prefill = states.prefillMs(nodeId)
                moves = states.promptsMove(nodeId)
            held = matches.get(nodeId, 0)
            records.append(
                Owner(node, value, room, free is not None, loaded, held, nodeId == home,
                      roots(nodeId), prefill, wait, max(0, free or 0), moves)
            )  # fmt: skip
        return records

    def place(
        self,
        ordered: Sequence[Node],
        key: AffinityKey,
        model: str | None,
        hold: Hold,
        engineId: str | None,
        crowded: bool = False,
    ) -> Choice | None:
        """Choose the request's node among ``ordered`` (``choose.choose``; None when there
        is none) and move it to the front (the caller reserves it).  ``model`` is the model
        asked for (whether engines have it loaded); ``hold`` whether it may be held;
        ``engineId`` counts the outcome (None: not again); ``crowded`` whether other
        requests wait in the proxy.  A choice to hold is neither counted nor recorded: the
        caller holds the request, then places it again."""
        if not ordered:
            return None
        owners = self.owners(ordered, key, model)
        choice = choose(owners, key, hold, crowded)
        if choice.hold is not None:
            return choice  # counted where it goes once let out
        if engineId is not None:
            self.counts.setdefault(engineId, Counter())[choice.result] += 1
        nodeId = choice.node.id
        key.expect = None
        index = self.index
        if choice.matched:
            stamp = index.stampOf(nodeId, key.blocks[choice.matched - 1])
            if stamp is not None and (nodeId, stamp) not in self.unread:
                key.expect = (nodeId, key.ends[choice.matched - 1], stamp)
        if key.blocks:
            # Held from now on (the engine holds the prompt once it has read it): the next
            # request of this family, even one arriving before this one commits, finds it.
            key.root = familyRoot(key.ends, fleetRate(owners))
            key.stamp = index.record(nodeId, key.blocks, key.ends, key.root)
            key.placed = nodeId
            unread = self.unread
            unread[nodeId, key.stamp] = None
            if len(unread) > MAX_UNREAD:
                unread.popitem(last=False)
        toFront(ordered, choice.position)
        return choice

    def served(self, key: AffinityKey, nodeId: str) -> None:
        """``nodeId`` committed this request: it is the conversation's home now, and holds
        the request's blocks (recorded when placed, again here after a failover); its
        engine has read the prompt."""
        if key.placed is not None:
            self.unread.pop((key.placed, key.stamp), None)
        for digest in key.records:
            self.table.record(digest, nodeId)
        if key.expect is not None and key.expect[0] != nodeId:
            key.expect = None  # failed over: the node that served was expected nothing
        if key.blocks and key.placed != nodeId:
            self.index.record(nodeId, key.blocks, key.ends, key.root)

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
            self.expectedMisses += 1
            self.index.dropOlder(nodeId, expect[2])
        else:
            self.expectedHits += 1

    def countsOf(self, engineId: str) -> dict[str, int]:
        """The placements of ``engineId``'s requests by outcome (``hit``, ``miss``,
        ``overridden``), every outcome present."""
        counts = self.counts.get(engineId, Counter())
        return {result.name.lower(): counts[result] for result in Placed}

    def status(self) -> dict[str, object]:
        """The ``/status`` view: table size and limits, the index, counts per engine."""
        index = self.index
        return {
            "entries": len(self.table),
            "maxEntries": self.table.maxEntries,
            "maxAgeSeconds": self.table.maxAge,
            "maxImbalance": MAX_IMBALANCE,
            "counts": {engineId: self.countsOf(engineId) for engineId in sorted(self.counts)},
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
                "expectedHits": self.expectedHits,
                "expectedMisses": self.expectedMisses,
                "staleDropped": index.dropped,
            },
        }


class ServedWorkload(Protocol):
    """What ``requestServed`` reads of a workload: its terminal statistics."""

    @property
    def stats(self) -> Mapping[str, object] | None: ...


class ServedExchange(Protocol):
    """What ``requestServed`` reads of an ended exchange."""

    @property
    def committedStatus(self) -> int | None: ...
    @property
    def servedBy(self) -> str | None: ...
    @property
    def workload(self) -> ServedWorkload | None: ...
    @property
    def prefixKey(self) -> AffinityKey | None: ...


class ICacheCounts(Protocol):
    """Where ``requestServed`` adds what an engine reported of its cache
    (``nodestate.states.EngineStates.served``)."""

    def served(
        self, nodeId: str, prompt: int, cached: int, promptMs: float | None = None
    ) -> None: ...


def servedStats(exchange: ServedExchange) -> tuple[str, int, int, float | None] | None:
    """(node, prompt tokens, cached prompt tokens, prompt milliseconds or None) of an ended
    exchange whose engine reported both counts, else None."""
    workload = exchange.workload
    stats = None if workload is None else workload.stats
    nodeId = exchange.servedBy
    if exchange.committedStatus is None or nodeId is None or stats is None:
        return None
    prompt, cached = stats.get("promptTokens"), stats.get("cachedTokens")
    if type(prompt) is not int or type(cached) is not int:
        return None
    promptMs = stats.get("promptMs")
    return nodeId, prompt, cached, promptMs if type(promptMs) is float else None


def requestServed(
    exchange: ServedExchange, states: ICacheCounts, affinity: Affinity | None
) -> None:
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
