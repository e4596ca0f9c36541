"""Where a standalone inference request goes among its owners (spec §11.1): the cached prefix
weighed against free slots and loaded models.

Per owner: *matched*, its longest cached prefix of the request (prefix index, in characters;
the conversation's home from the affinity table breaks ties), *room* (a free slot as the engine
last reported it less our reservations since, ``EngineStates.availableSlots``; where the
engine's slots are unknown, a load within ``maxImbalance`` of the least-loaded owner's), and
*loaded* (False only when the engine says the model is not loaded).

A cached prefix shorter than ``MIN_MATCH_CHARS`` does not count (a one-line system prompt
shared by everyone groups nothing worth grouping).

1. Some owner holds a prefix: the best by (not unloaded, matched, is home) is chosen if it has
   room, or if no owner has room.  Otherwise the best owner that has room (by not unloaded,
   matched, least load, rendezvous) is chosen instead when it is not unloaded while the best
   is loaded and what it must recompute beyond the best's prefix is at most
   ``RECOMPUTE_CHARS`` characters (recomputing that costs less than waiting for a slot).
   Otherwise, where the best's slots are known (from its engine, or ``full``) and the
   proxy can hold the request (``Hold.ALLOWED``), it is *held* in the proxy for the best's
   next free slot (a choice with a ``hold``), at most as long as recomputing the
   difference would take on the owner with room (``holdBudget``, at that engine's
   reported prefill time, else the best's); once that budget is spent (``Hold.SPENT``) it
   goes to the owner with room and recomputes, and when the best shows room first (``Hold.ROOMY``)
   it goes to the best.  Waiting at most as long as recomputing costs keeps its time to
   first token within twice the better of the two choices (the ski-rental bound).  With no
   hold in the proxy (``Hold.NONE``) the request waits for the best inside its engine.
2. No owner holds a prefix (a new prompt family: a new tenant's system prompt, a new
   conversation): among the owners not unloaded, those holding the fewest prompt families
   (distinct family blocks: a request's first block ending at ``MIN_MATCH_CHARS`` or later)
   that have room; failing that, those holding at most
   ``ROOT_SLACK`` more families that have room; failing that, the fewest-family ones.
   Then the least loaded, ties by rendezvous hashing on the family block's digest.  So
   tenants spread evenly over the engines (within ``ROOT_SLACK``), and a full engine gets
   a new family only when the engines about as loaded with families are full too.  A
   prompt shorter than ``MIN_MATCH_CHARS`` has no family: the least loaded owner with room,
   ties by rendezvous on the whole request's digest (as conversation affinity always did).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from nvpair.proxy.placement.prefixindex import PrefixIndex

if TYPE_CHECKING:
    from nvpair.proxy.nodestate.states import EngineStates
    from nvpair.proxy.routing.nodes import Node

RECOMPUTE_CHARS = 2048  # about 512 tokens: recomputing less than this beats waiting
MIN_MATCH_CHARS = 512  # a shorter cached prefix (about 128 tokens) is not worth a placement
RENDEZVOUS_SCAN = 64  # owners scored per new prompt family, at most
ROOT_SLACK = 1  # families more than the fewest an engine with room may take a new one at
MISS_SHARE = 0.5  # a reported cached share under half the expected one is a miss
CHARS_PER_TOKEN = 4  # prompt characters per token, for the recompute estimate
HOLD_DEFAULT = 0.5  # seconds held when no engine has reported its prefill time yet
HOLD_MAX = 5.0  # seconds held at most, however slow the engine

_MASK = (1 << 64) - 1


def mix(x: int) -> int:
    """A 64-bit finalizer (SplitMix64's): every input bit moves about half the output bits,
    so rendezvous scores of one key on different nodes are as good as independent (Python's
    tuple hash alone leaves them correlated, and one node then wins most ties)."""
    x &= _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class Placed(IntEnum):
    """How a request was placed; each indexes its count."""

    HIT = 0  # on the owner holding its longest prefix (or its home)
    MISS = 1  # no owner holds a prefix: a new prompt family, spread
    OVERRIDDEN = 2  # the prefix holder had no room: an owner with room, recomputing


RESULTS = ("hit", "miss", "overridden")  # the counts' names, in ``Placed`` order (a held
# request is counted where it goes once let out)


class Hold(IntEnum):
    """Whether a request whose prefix holder is full may be held in the proxy for it."""

    NONE = 0  # no hold in the proxy (no queue): it waits for the holder inside the engine
    ALLOWED = 1  # it may be held (once) for the holder's next free slot
    SPENT = 2  # held as long as recomputing costs, or could not be: it recomputes
    ROOMY = 3  # let out of its hold because the holder has room: it goes there


class Choice:
    """The chosen owner's position, how it was chosen, its matched prefix (blocks), and
    for a request to hold for that owner the seconds it may be held (else 0)."""

    __slots__ = ("position", "result", "matched", "hold")

    def __init__(self, position: int, result: Placed, matched: int, hold: float = 0.0) -> None:
        self.position = position
        self.result = result
        self.matched = matched
        self.hold = hold


def choose(
    ordered: Sequence[Node],
    blocks: Sequence[int],
    ends: Sequence[int],
    spread: int,
    home: str | None,
    load: Callable[[str], float],
    index: PrefixIndex,
    states: EngineStates | None,
    model: str | None,
    maxImbalance: int,
    recomputeChars: int = RECOMPUTE_CHARS,
    hold: Hold = Hold.NONE,
    full: Collection[Node] = (),
) -> Choice:
    """Choose among ``ordered`` (non-empty) by the rules above; ``full`` are known to have
    no room whatever their engines last said (the queue's room board)."""
    ids = [node.id for node in ordered]  # one pass: ``ordered`` may be a lazy view
    count = len(ids)
    loads = [load(nodeId) for nodeId in ids]
    least = min(loads)
    matches = index.matches(blocks)
    if states is None:
        room = [value <= least + maxImbalance for value in loads]
        ready = [1] * count
        known = [False] * count
    else:
        room = []
        ready = []
        known = []
        read = states.roomAndLoaded
        for position, nodeId in enumerate(ids):
            free, loaded = read(nodeId, model)
            room.append(free > 0 if free is not None else loads[position] <= least + maxImbalance)
            ready.append(0 if loaded is False else 1)
            known.append(free is not None)
    if full:
        fullIds = {node.id for node in full}
        for position, nodeId in enumerate(ids):
            if nodeId in fullIds:
                room[position], known[position] = False, True
    matched = [0] * count
    best = -1
    bestScore: tuple[int, int, bool] = (0, 0, False)
    if matches or home is not None:
        for position, nodeId in enumerate(ids):
            held = matches.get(nodeId, 0)
            if held and ends[held - 1] < MIN_MATCH_CHARS:
                held = 0
            matched[position] = held
            isHome = nodeId == home
            if held or isHome:
                score = (ready[position], held, isHome)
                if best < 0 or score > bestScore:
                    best, bestScore = position, score
    if best >= 0:
        if room[best] or hold is Hold.ROOMY or not any(room):
            return Choice(best, Placed.HIT, matched[best])
        alt = _pick(ids, [i for i in range(count) if room[i]], ready, matched, loads, spread)
        extra = _chars(ends, matched[best]) - _chars(ends, matched[alt])
        if ready[alt] >= ready[best]:
            if extra <= recomputeChars or hold is Hold.SPENT:
                return Choice(alt, Placed.OVERRIDDEN, matched[alt])
            if hold is Hold.ALLOWED and known[best]:
                rate = None
                if states is not None:  # the free owner's prefill time, else the holder's
                    rate = states.prefillMs(ids[alt]) or states.prefillMs(ids[best])
                return Choice(best, Placed.HIT, matched[best], holdBudget(extra, rate))
        return Choice(best, Placed.HIT, matched[best])
    top = max(ready)
    pool = [i for i in range(count) if ready[i] == top]
    root = familyRoot(ends)
    if root is not None:
        roots = [index.roots(nodeId) for nodeId in ids]
        fewest = min(roots[i] for i in pool)
        pool = (
            [i for i in pool if roots[i] == fewest and room[i]]
            or [i for i in pool if roots[i] <= fewest + ROOT_SLACK and room[i]]
            or [i for i in pool if roots[i] == fewest]
        )
    else:
        pool = [i for i in pool if room[i]] or pool
    spreadBy = spread if root is None else blocks[root]
    return Choice(_pick(ids, pool, ready, None, loads, spreadBy), Placed.MISS, 0)


def holdBudget(extraChars: int, msPerToken: float | None) -> float:
    """Seconds a request may be held for its prefix holder: what recomputing ``extraChars``
    characters takes at ``msPerToken`` (the engine's reported prefill time per token;
    ``HOLD_DEFAULT`` when unknown), at most ``HOLD_MAX``."""
    if msPerToken is None:
        return HOLD_DEFAULT
    return min(HOLD_MAX, extraChars / CHARS_PER_TOKEN * msPerToken / 1000.0)


def familyRoot(ends: Sequence[int]) -> int | None:
    """The block that names a request's prompt family (what tenants share: the first block
    ending at ``MIN_MATCH_CHARS`` or later), or None for a prompt shorter than that."""
    for position, end in enumerate(ends):
        if end >= MIN_MATCH_CHARS:
            return position
    return None


def _chars(ends: Sequence[int], matched: int) -> int:
    """The characters the first ``matched`` blocks cover."""
    return ends[matched - 1] if matched else 0


def _pick(
    ids: Sequence[str],
    pool: list[int],
    ready: list[int],
    matched: list[int] | None,
    loads: list[float],
    spread: int,
) -> int:
    """The best of ``pool``: not unloaded, most matched, least loaded, then rendezvous."""
    top = max(ready[i] for i in pool)
    pool = [i for i in pool if ready[i] == top]
    if matched is not None:
        most = max(matched[i] for i in pool)
        pool = [i for i in pool if matched[i] == most]
    lightest = min(loads[i] for i in pool)
    best = -1
    bestScore = 0
    for scanned, position in enumerate(i for i in pool if loads[i] == lightest):
        if scanned >= RENDEZVOUS_SCAN:
            break
        score = mix(spread ^ hash(ids[position]))
        if best < 0 or score > bestScore:
            best, bestScore = position, score
    return best


def confirmedMiss(expectedChars: int, chars: int, prompt: int, cached: int) -> bool:
    """Whether an engine that reported ``cached`` of ``prompt`` tokens missed a prefix the
    index expected it to hold (``expectedChars`` of a ``chars``-character prompt): its
    cached share is under ``MISS_SHARE`` of the expected share."""
    if expectedChars <= 0 or prompt <= 0 or chars <= 0:
        return False
    expected = min(1.0, expectedChars / chars)
    return cached / prompt < MISS_SHARE * expected


def servedStats(exchange: Any) -> tuple[str, int, int, float | None] | None:
    """(node, prompt tokens, cached prompt tokens, prompt milliseconds or None) of an ended
    exchange whose engine reported both counts, else None."""
    committed = exchange.committed
    workload = exchange.workload
    if committed is None or workload is None or workload.stats is None:
        return None
    stats = workload.stats
    prompt, cached = stats.get("promptTokens"), stats.get("cachedTokens")
    if type(prompt) is not int or type(cached) is not int:
        return None
    promptMs = stats.get("promptMs")
    if type(promptMs) is not float:
        promptMs = None
    return committed.node.id, prompt, cached, promptMs
