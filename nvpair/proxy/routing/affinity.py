"""Conversation affinity (spec §11.1): keep a conversation on the node that holds its cache.

Standalone mode only (under a broker the scheduler ranks).  Each inference request on a
chat, completion or generate route gets an ``AffinityKey``: digests of the model and of
successive leading parts of its prompt (message-list prefixes for chat routes; for prompt
text the whole text and its prefixes of 256·2^k characters).  A later turn, whose
messages extend an earlier turn's, finds among its prefix digests the earlier turn's
whole-request digest, and with it the node that served that turn.

``AffinityTable`` keeps only those digests (64-bit integers, never text), capped both in
entries and in age, so its memory is constant under any load.  ``Affinity.place`` puts the
conversation's home first unless it is overloaded against the least-loaded owner by more
than ``MAX_IMBALANCE`` requests; otherwise it reserves the least-loaded owner, equal loads
broken by rendezvous hashing on the request's own digest, so distinct conversations spread
even when they arrive one at a time.  The node that commits becomes the home.

Digests are Python's per-process keyed ``hash`` of tuples of the strings (SipHash of each
string, no copy or encoding of the text): a collision can only misplace a request.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from enum import IntEnum
from typing import Protocol

from twisted.internet.interfaces import IReactorTime

from nvpair.proxy.routing.candidates import toFront
from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.routing.reservations import ReservationMap

__all__ = ["Affinity", "AffinityKey", "AffinityTable", "affinityStatus", "keyFor"]

MAX_LOOKUPS = 8  # the longest message-list prefixes looked up per request
MAX_MESSAGES = 4096  # a longer message list gets no key
PROMPT_BLOCK = 256  # prompt prefixes are taken at 256·2^k characters
MAX_IMBALANCE = 2  # home keeps the turn while its load <= least-loaded owner's + this
MAX_ENTRIES = 16384
MAX_AGE = 900.0
RENDEZVOUS_SCAN = 64  # equally loaded owners scored per new conversation, at most

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
    """One request's digests: looked up (longest first), recorded at commit, spread by."""

    __slots__ = ("lookups", "records", "spread")

    def __init__(self, lookups: tuple[int, ...], records: tuple[int, ...]) -> None:
        self.lookups = lookups
        self.records = records
        self.spread = records[0]


def _messagePart(message: object) -> object:
    if type(message) is dict and len(message) == 2:
        role = message.get("role")
        content = message.get("content")
        if type(role) is str and type(content) is str:
            return (role, content)  # the common shape: hashed without serializing
    return json.dumps(message, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """A 64-bit finalizer (SplitMix64's): every input bit moves about half the output bits,
    so rendezvous scores of one key on different nodes are as good as independent (Python's
    tuple hash alone leaves them correlated, and one node then wins most ties)."""
    x &= _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _chatKey(seed: int, messages: object) -> AffinityKey | None:
    if type(messages) is not list or not messages or len(messages) > MAX_MESSAGES:
        return None
    digest = seed
    first = len(messages) - MAX_LOOKUPS
    lookups: list[int] = []
    for index, message in enumerate(messages):
        digest = hash((digest, _messagePart(message)))
        if index >= first:
            lookups.append(digest)
    lookups.reverse()
    return AffinityKey(tuple(lookups), (digest,))


def _promptKey(seed: int, prompt: str) -> AffinityKey | None:
    if not prompt:
        return None
    whole = hash((seed, prompt))
    aligned: list[int] = []
    length = PROMPT_BLOCK
    while length <= len(prompt):  # every slice together copies under twice the prompt
        aligned.append(hash((seed, prompt[:length])))
        length *= 2
    aligned.reverse()
    records = (whole, aligned[0]) if aligned else (whole,)
    return AffinityKey((whole, *aligned[: MAX_LOOKUPS - 1]), records)


def keyFor(engineId: str, model: str, path: bytes, doc: object) -> AffinityKey | None:
    """The affinity key of a request on ``path`` with the parsed JSON body ``doc``, if any."""
    kind = ROUTES.get(path)
    if kind is None or type(doc) is not dict:
        return None
    seed = hash(("nvpair-affinity", engineId, model))
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


class Placed(IntEnum):
    """How ``Affinity.place`` placed a conversation's request; each indexes its count."""

    HIT = 0  # on its home
    MISS = 1  # no home known: the least-loaded owner
    OVERRIDDEN = 2  # its home was overloaded: the least-loaded owner


RESULTS = ("hit", "miss", "overridden")  # the counts' names, in ``Placed`` order


class Affinity:
    """The process's conversation affinity: the table, the ordering rule and its counts."""

    def __init__(
        self,
        clock: IReactorTime,
        maxEntries: int = MAX_ENTRIES,
        maxAge: float = MAX_AGE,
        maxImbalance: int = MAX_IMBALANCE,
    ) -> None:
        self.table = AffinityTable(clock, maxEntries, maxAge)
        self.maxImbalance = maxImbalance
        self.counts: dict[str, list[int]] = {}  # engine id -> [hits, misses, overridden]

    def _count(self, engineId: str, result: Placed) -> None:
        counts = self.counts.get(engineId)
        if counts is None:
            counts = self.counts[engineId] = [0, 0, 0]
        counts[result] += 1

    def place(
        self,
        ordered: Sequence[Node],
        key: AffinityKey,
        reservations: ReservationMap,
        engineId: str | None,
    ) -> Node | None:
        """Move the request's node to the front of ``ordered`` and return it (the caller
        reserves it): the conversation's home unless overloaded, else the least-loaded owner
        (ties by rendezvous on ``key``).  ``engineId`` counts the outcome (None: not again)."""
        if not ordered:
            return None
        load = reservations.estimatedLoad
        loads = [load(node.id) for node in ordered]
        least = min(loads)
        home = self.table.lookup(key.lookups)
        result = Placed.MISS
        if home is not None:
            for position, node in enumerate(ordered):
                if node.id == home:
                    if loads[position] <= least + self.maxImbalance:
                        if engineId is not None:
                            self._count(engineId, Placed.HIT)
                        toFront(ordered, position)
                        return node
                    result = Placed.OVERRIDDEN
                    break
        if engineId is not None:
            self._count(engineId, result)
        spread = key.spread
        best = -1
        bestScore = 0
        scanned = 0
        for position, node in enumerate(ordered):
            if loads[position] != least:
                continue
            score = _mix(spread ^ hash(node.id))
            if best < 0 or score > bestScore:
                best, bestScore = position, score
            scanned += 1
            if scanned >= RENDEZVOUS_SCAN:
                break
        chosen = ordered[best]
        toFront(ordered, best)
        return chosen

    def served(self, key: AffinityKey, nodeId: str) -> None:
        """``nodeId`` committed this request: it is the conversation's home now."""
        for digest in key.records:
            self.table.record(digest, nodeId)

    def status(self) -> dict[str, object]:
        """The ``/status`` view: table size and limits, counts per engine."""
        return {
            "entries": len(self.table),
            "maxEntries": self.table.maxEntries,
            "maxAgeSeconds": self.table.maxAge,
            "maxImbalance": self.maxImbalance,
            "counts": {
                engineId: dict(zip(RESULTS, counts, strict=True))
                for engineId, counts in sorted(self.counts.items())
            },
        }


class _Mode(Protocol):
    @property
    def affinity(self) -> str: ...


class AffinityOwner(Protocol):
    """What ``affinityStatus`` reads of the process (or any view of it): the ``--affinity``
    setting, and the conversation affinity when it orders candidates."""

    @property
    def settings(self) -> _Mode: ...

    @property
    def affinity(self) -> Affinity | None: ...


def affinityStatus(service: AffinityOwner) -> dict[str, object]:
    """The ``affinity`` object of ``/status``: the mode, whether it orders, and its table."""
    affinity = service.affinity
    document: dict[str, object] = {
        "mode": service.settings.affinity,
        "active": affinity is not None,
    }
    if affinity is not None:
        document.update(affinity.status())
    return document
