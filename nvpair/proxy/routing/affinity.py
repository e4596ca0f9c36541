"""Conversation affinity (spec §11.1): keep a conversation on the node that holds its cache.

Standalone mode only (under a broker the scheduler ranks).  Each inference request on a
chat, completion or generate route gets an ``AffinityKey``: digests of the model and of
successive leading parts of its prompt (message-list prefixes for chat routes; for prompt
text the whole text and its prefixes of 256·2^k characters).  A later turn, whose
messages extend an earlier turn's, finds among its prefix digests the earlier turn's
whole-request digest, and with it the node that served that turn.

``AffinityTable`` keeps only those digests (64-bit integers, never text), capped both in
entries and in age, so its memory is constant under any load.  Layered on it, the prefix
index (``prefixindex``) matches any shared leading blocks of prompt material (a tenant's
system prompt, a shared document), which whole-request digests cannot.  ``Affinity.place``
chooses by ``prefixplace.choose``: the owner holding the longest prefix (the conversation's
home breaking ties) unless it has no room while another owner does and recomputing the
difference is cheap; a new prompt family goes to the owner holding the fewest families.
The node that commits becomes the home and holds the request's blocks.

Digests are Python's per-process keyed ``hash`` of tuples of the strings (SipHash of each
string, no copy or encoding of the text): a collision can only misplace a request.
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from twisted.internet.interfaces import IReactorTime

from nvpair.proxy.routing.candidates import toFront
from nvpair.proxy.routing.enginestates import EngineStates
from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.routing.prefixindex import MAX_BLOCKS, PrefixIndex
from nvpair.proxy.routing.prefixplace import (
    RESULTS,
    Hold,
    Placed,
    choose,
    confirmedMiss,
    familyRoot,
    servedStats,
)
from nvpair.proxy.routing.reservations import ReservationMap

__all__ = [
    "RESULTS",
    "Affinity",
    "AffinityKey",
    "AffinityTable",
    "Hold",
    "Placed",
    "keyFor",
]

MAX_LOOKUPS = 8  # the longest message-list prefixes looked up per request
MAX_MESSAGES = 4096  # a longer message list gets no key
PROMPT_BLOCK = 256  # prompt prefixes are taken at 256·2^k characters
MAX_IMBALANCE = 2  # home keeps the turn while its load <= least-loaded owner's + this
MAX_ENTRIES = 16384
MAX_AGE = 900.0

CHAT, PROMPT, RESPONSES = "chat", "prompt", "responses"
ROUTES: dict[bytes, str] = {
    b"/v1/chat/completions": CHAT,
    b"/api/chat": CHAT,
    b"/api/v0/chat/completions": CHAT,
    b"/v1/completions": PROMPT,
    b"/api/generate": PROMPT,
    b"/api/v0/completions": PROMPT,
    b"/v1/responses": RESPONSES,
}


class AffinityKey:
    """One request's digests: looked up (longest first), recorded at commit, spread by; its
    prompt's chained block digests with where each block ends (characters) for the prefix
    index, what placement expected of the node it chose (node, matched blocks, index
    stamp) until the engine confirms a hit or a miss, and the seconds it may be held in
    the proxy for that node when placement held it (else None)."""

    __slots__ = ("lookups", "records", "spread", "blocks", "ends", "expect", "placed", "hold")

    def __init__(
        self,
        lookups: tuple[int, ...],
        records: tuple[int, ...],
        blocks: tuple[int, ...] = (),
        ends: tuple[int, ...] = (),
    ) -> None:
        self.lookups = lookups
        self.records = records
        self.spread = records[0]
        self.blocks = blocks
        self.ends = ends
        self.expect: tuple[str, int, int] | None = None
        self.placed: str | None = None  # the node its blocks were recorded on when placed
        self.hold: float | None = None

    @property
    def chars(self) -> int:
        """The characters of prompt material the blocks cover."""
        return self.ends[-1] if self.ends else 0


def _messagePart(message: object) -> object:
    if type(message) is dict and len(message) == 2:
        role = message.get("role")
        content = message.get("content")
        if type(role) is str and type(content) is str:
            return (role, content)  # the common shape: hashed without serializing
    return json.dumps(message, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


@functools.lru_cache(maxsize=MAX_MESSAGES)
def _marks(count: int) -> tuple[int, ...]:
    """Which message prefixes of a list of ``count`` messages are prefix-index blocks: the
    first four (system prompt, shared documents), those of 2^k messages, and the last two
    turns' ends (so a later turn finds the earlier turn's whole prompt)."""
    marks = {i for i in range(min(count, 4))} | {count - 1}
    length = 8
    while length <= count:
        marks.add(length - 1)
        length *= 2
    if count >= 3:
        marks.add(count - 3)
    return tuple(sorted(marks))[:MAX_BLOCKS]


def _chatKey(seed: int, messages: object) -> AffinityKey | None:
    if type(messages) is not list or not messages or len(messages) > MAX_MESSAGES:
        return None
    digest = seed
    digests: list[int] = []
    ends: list[int] = []
    addDigest, addEnd = digests.append, ends.append
    size = 0
    for message in messages:  # chained: one digest per message prefix
        part = _messagePart(message)
        digest = hash((digest, part))
        size += len(part[1]) if type(part) is tuple else len(part)  # type: ignore[arg-type]
        addDigest(digest)
        addEnd(size)
    marks = _marks(len(digests))
    return AffinityKey(
        tuple(digests[: -MAX_LOOKUPS - 1 : -1]),
        (digest,),
        tuple([digests[i] for i in marks]),
        tuple([ends[i] for i in marks]),
    )


def _promptKey(seed: int, prompt: str) -> AffinityKey | None:
    if not prompt:
        return None
    whole = hash((seed, prompt))
    aligned: list[int] = []
    lengths: list[int] = []
    length = PROMPT_BLOCK
    while length <= len(prompt):  # every slice together copies under twice the prompt
        aligned.append(hash((seed, prompt[:length])))
        lengths.append(length)
        length *= 2
    blocks, ends = list(aligned), list(lengths)  # the prefixes, then the whole text
    if not lengths or lengths[-1] != len(prompt):
        blocks.append(whole)
        ends.append(len(prompt))
    aligned.reverse()
    records = (whole, aligned[0]) if aligned else (whole,)
    return AffinityKey((whole, *aligned[: MAX_LOOKUPS - 1]), records, tuple(blocks), tuple(ends))


def keyFor(engineId: str, model: str, path: bytes, doc: object) -> AffinityKey | None:
    """The affinity key of a request on ``path`` with the parsed JSON body ``doc``, if any."""
    kind = ROUTES.get(path)
    if kind is None or type(doc) is not dict:
        return None
    return _keyOf(kind, hash(("nvpair-affinity", engineId, model)), doc)


def _keyOf(kind: str, seed: int, doc: dict[str, object]) -> AffinityKey | None:
    if kind == CHAT:
        return _chatKey(seed, doc.get("messages"))
    if kind == RESPONSES:
        source = doc.get("input")
        instructions = doc.get("instructions")
        if type(instructions) is str:
            seed = hash((seed, instructions))
        return (
            _chatKey(seed, source)
            if type(source) is list
            else (_promptKey(seed, source) if type(source) is str else None)
        )
    prompt = doc.get("prompt")
    if type(prompt) is list and len(prompt) == 1:
        prompt = prompt[0]
    system = doc.get("system")
    if type(system) is str:
        seed = hash((seed, system))
    return _promptKey(seed, prompt) if type(prompt) is str else None


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
        a confirmed miss of what the index expected drops that node's stale entries."""
        expect = key.expect
        key.expect = None
        if expect is None or expect[0] != nodeId:
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
