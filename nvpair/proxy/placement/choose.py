"""Where a standalone inference request goes among its owners (spec §11 "Placement"): the
cached prefix weighed against room and loaded models, in time.

``choose`` reads one ``Owner`` record per owner: *matched*, its longest cached prefix of the
request (prefix index blocks); *home*, whether it served the conversation's previous turn
(it counts only where the whole prompt is worth ``MIN_MATCH_SECONDS`` of recomputing there,
or the client named its group: a short repeated prompt is spread by load like a new one);
*room*, whether it can take the request now (the room ledger's *free now*; where that is
unknown, a load within ``MAX_IMBALANCE`` of the least-loaded owner's) and whether that is
*known*; *loaded* (False only when the engine says the model is not loaded); its load, its
prompt families, and its engine's prefill time per token.

Thresholds are in time, not characters: recomputing ``c`` characters on an engine costs
``c / CHARS_PER_TOKEN`` tokens at its reported prefill time per token (``prefillMs``;
``DEFAULT_MS_PER_TOKEN`` before it reported one, which makes the thresholds today's 512
and 2,048 characters).  A cached prefix that would take less than ``MIN_MATCH_SECONDS`` to
recompute on its holder does not count (a one-line system prompt shared by everyone groups
nothing worth grouping, and a short one on a fast engine must not pile users onto one
node).

1. Some owner holds a prefix (or is the conversation's home).  A new conversation (no
   owner is its home, its client named no group) whose best holder's engine *moves* a
   saved prompt to the request that matches it best instead of copying it (llama.cpp's
   own server, ``--cache-ram``: ``Owner.moves``) goes *apart*: to the least loaded owner
   with room that holds none of its prefix (placed as a miss); where every such owner is
   full, it is held in the proxy for the least loaded of them (``Hold.ALLOWED``, its room
   known) at most ``HOLD_MAX``, then placed by the rules below (the hold spent); where no
   owner has room at all, it waits apart, in that owner's engine.  Beside its family (the
   system prompt its tenant's other conversations share) it would take a sibling's saved
   turns for the shared prefix alone, and the sibling, its own turns gone, the next one's;
   apart, the family is recomputed once and each keeps its own turns.  Otherwise the best
   by (not unloaded, matched, is home) is chosen if it has room, or if no owner has room.
   Otherwise the best owner with room (by not unloaded, matched, least load, rendezvous)
   is chosen instead (*overridden*) when it is not unloaded while the best is loaded and
   recomputing what it lacks of the best's prefix costs at most ``RECOMPUTE_SECONDS``
   there, unless
   the proxy can hold the request and the best's expected wait for a slot (*wait*: the
   time ours hold a slot there over its capacity, from the room ledger) is shorter than
   that recompute (or the hold was spent, unless the proxy is *crowded*: below).
   Otherwise, where the best's room is known and the proxy can hold the request
   (``Hold.ALLOWED``), the choice is to *hold* it in the proxy for the best's next free
   slot, at most as long as recomputing the difference would take on the owner with room
   (``holdBudget``); let out because the best has room (``Hold.ROOMY``) it goes there.
   Waiting at most as long as recomputing costs keeps its time to first token within twice
   the better of the two choices (the ski-rental bound).
   With no hold in the proxy (``Hold.NONE``) the request waits for the best inside its
   engine.  A hold that was spent while the proxy is crowded (other requests wait in it,
   held or queued) also goes to the best, whose room is known, to wait in its engine: a
   slot free elsewhere is about to be taken by one of them, so recomputing there would
   cost the fleet the recompute and this request's cache, not buy a free slot.  The same
   holds before any hold (*stays*): where the best's room is known, one of its slots is
   expected within ``HOLD_MAX`` and fewer than ``SPARE_SLOTS`` slots are known free in
   all, the request goes to the best to wait in its engine, neither held nor moved: the
   one free slot is the fleet's last, and on a busy fleet its own owner's next request
   wants it a moment later.
2. No owner holds a prefix (a new prompt family: a new tenant's system prompt, a new
   conversation): among the owners not unloaded, those holding the fewest prompt families
   that have room; failing that, those holding at most ``ROOT_SLACK`` more that have room;
   failing that, the fewest-family ones.  Then the least loaded, ties by rendezvous hashing
   on the family block's digest.  A request's family is its first block whose recompute
   cost reaches ``MIN_MATCH_SECONDS`` at the owners' prefill time (``familyRoot``); a
   prompt shorter than that has none: the least loaded owner with room, ties by rendezvous
   on the whole request's digest.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from nvpair.proxy.placement.keys import AffinityKey
    from nvpair.proxy.routing.nodes import Node

CHARS_PER_TOKEN = 4  # prompt characters per token, for the recompute estimates
DEFAULT_MS_PER_TOKEN = 1.0  # prefill time per token before an engine reported its own
MIN_MATCH_SECONDS = 0.128  # a cached prefix cheaper to recompute than this does not count
RECOMPUTE_SECONDS = 0.512  # recomputing at most this elsewhere beats waiting for a slot
MAX_IMBALANCE = 2  # unknown room: a load within this of the least-loaded owner's has room
RENDEZVOUS_SCAN = 64  # owners scored per new prompt family, at most
ROOT_SLACK = 1  # families more than the fewest an engine with room may take a new one at
MISS_SHARE = 0.5  # a reported cached share under half the expected one is a miss
HOLD_MAX = 5.0  # seconds held at most, however slow the engine
SPARE_SLOTS = 2  # slots known free in the fleet for a full holder's request to move

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
    """How a request was placed."""

    HIT = 0  # on the owner holding its longest prefix (or its home)
    MISS = 1  # no owner holds a prefix (a new prompt family), or a new conversation apart
    OVERRIDDEN = 2  # the prefix holder had no room: an owner with room, recomputing


class Hold(IntEnum):
    """Whether a request whose prefix holder is full may be held in the proxy for it."""

    NONE = 0  # no hold in the proxy (no queue): it waits for the holder inside the engine
    ALLOWED = 1  # it may be held (once) for the holder's next free slot
    SPENT = 2  # held as long as recomputing costs, or could not be: it recomputes
    ROOMY = 3  # let out of its hold because the holder has room: it goes there


@attrs.frozen
class Owner:
    """What ``choose`` reads of one owner (see the module docstring)."""

    node: Node
    load: float
    room: bool
    known: bool  # whether ``room`` comes from the room ledger (else from load alone)
    loaded: bool | None = None
    matched: int = 0  # blocks of the request's prompt it holds
    home: bool = False
    families: int = 0
    prefillMs: float | None = None
    wait: float | None = None  # expected seconds until one of its slots frees (None: unknown)
    free: int = 0  # its slots known free now (0 where unknown)
    moves: bool = False  # its engine's prompt cache moves a saved prompt (llama-server's)

    @property
    def ready(self) -> int:
        """1 unless its engine says the model is not loaded."""
        return 0 if self.loaded is False else 1


@attrs.frozen
class Choice:
    """The decision: the owner at ``position`` (``node``), how it was chosen, the prefix
    blocks it holds; or, when ``hold`` is set, hold the request in the proxy for ``node``'s
    next free slot at most that many seconds (placed again afterwards)."""

    position: int
    node: Node
    result: Placed
    matched: int = 0
    hold: float | None = None


def recomputeSeconds(chars: int, msPerToken: float | None) -> float:
    """What recomputing ``chars`` characters of prompt costs at ``msPerToken``."""
    rate = DEFAULT_MS_PER_TOKEN if msPerToken is None else msPerToken
    return chars / CHARS_PER_TOKEN * rate / 1000.0


def holdBudget(extraChars: int, msPerToken: float | None) -> float:
    """Seconds a request may be held for its prefix holder: what recomputing ``extraChars``
    characters takes at ``msPerToken`` (the engine's reported prefill time), at most
    ``HOLD_MAX``."""
    return min(HOLD_MAX, recomputeSeconds(extraChars, msPerToken))


def fleetRate(owners: Sequence[Owner]) -> float | None:
    """The owners' mean reported prefill time per token, or None before any report."""
    rates = [o.prefillMs for o in owners if o.prefillMs is not None]
    return sum(rates) / len(rates) if rates else None


def familyRoot(ends: Sequence[int], msPerToken: float | None) -> int | None:
    """The block that names a request's prompt family (what tenants share: the first block
    worth ``MIN_MATCH_SECONDS`` of recomputing at ``msPerToken``), or None when the whole
    prompt is cheaper than that."""
    for position, end in enumerate(ends):
        if recomputeSeconds(end, msPerToken) >= MIN_MATCH_SECONDS:
            return position
    return None


def choose(owners: Sequence[Owner], key: AffinityKey, hold: Hold, crowded: bool = False) -> Choice:
    """Choose among ``owners`` (non-empty) for the request ``key`` by the rules above
    (``crowded``: whether other requests wait in the proxy)."""
    ends = key.ends
    matched = [
        o.matched
        if o.matched and recomputeSeconds(ends[o.matched - 1], o.prefillMs) >= MIN_MATCH_SECONDS
        else 0
        for o in owners
    ]
    whole = ends[-1] if ends and not key.hinted else None
    best = -1
    bestScore = (0, 0, False)
    for position, owner in enumerate(owners):
        home = owner.home and (
            whole is None or recomputeSeconds(whole, owner.prefillMs) >= MIN_MATCH_SECONDS
        )
        if matched[position] or home:
            score = (owner.ready, matched[position], home)
            if best < 0 or score > bestScore:
                best, bestScore = position, score
    apart = None if best < 0 else _apart(owners, key, hold, matched, best)
    if apart is not None:
        return apart
    if best >= 0:
        if crowded and hold is Hold.SPENT and owners[best].known:
            return Choice(best, owners[best].node, Placed.HIT, matched[best])
        return _prefixChoice(owners, key, hold, matched, best)
    top = max(o.ready for o in owners)
    pool = [i for i, o in enumerate(owners) if o.ready == top]
    root = familyRoot(ends, fleetRate(owners))
    if root is not None:
        fewest = min(owners[i].families for i in pool)
        pool = (
            [i for i in pool if owners[i].families == fewest and owners[i].room]
            or [i for i in pool if owners[i].families <= fewest + ROOT_SLACK and owners[i].room]
            or [i for i in pool if owners[i].families == fewest]
        )
    else:
        pool = [i for i in pool if owners[i].room] or pool
    position = _pick(owners, pool, None, key.spread if root is None else key.blocks[root])
    return Choice(position, owners[position].node, Placed.MISS)


def _prefixChoice(
    owners: Sequence[Owner], key: AffinityKey, hold: Hold, matched: list[int], best: int
) -> Choice:
    """Rule 1: the best prefix holder ``best``, an owner with room instead, or a hold."""
    holder = owners[best]
    if (
        holder.room
        or hold is Hold.ROOMY
        or not any(o.room for o in owners)
        or _stays(holder, owners)
    ):
        return Choice(best, holder.node, Placed.HIT, matched[best])
    alt = _pick(owners, [i for i, o in enumerate(owners) if o.room], matched, key.spread)
    other = owners[alt]
    extra = _chars(key.ends, matched[best]) - _chars(key.ends, matched[alt])
    if other.ready >= holder.ready:
        rate = other.prefillMs if other.prefillMs is not None else holder.prefillMs
        cost = recomputeSeconds(extra, rate)
        holdable = hold is Hold.ALLOWED and holder.known
        soon = holdable and holder.wait is not None and holder.wait < cost
        if hold is Hold.SPENT or (cost <= RECOMPUTE_SECONDS and not soon):
            return Choice(alt, other.node, Placed.OVERRIDDEN, matched[alt])
        if holdable:
            return Choice(best, holder.node, Placed.HIT, matched[best], holdBudget(extra, rate))
    return Choice(best, holder.node, Placed.HIT, matched[best])


def _apart(
    owners: Sequence[Owner], key: AffinityKey, hold: Hold, matched: list[int], best: int
) -> Choice | None:
    """A new conversation apart from its family (rule 1's first clause): the least loaded
    owner with room that holds none of its prompt; failing that, a hold for the least
    loaded such owner (at most ``HOLD_MAX``), or that owner where none has room at all.
    None where the best holder's engine does not move saved prompts, the request is no
    new conversation, or the hold was spent."""
    holder = owners[best]
    if hold is Hold.SPENT or not holder.moves or key.hinted or any(o.home for o in owners):
        return None
    away = [i for i, o in enumerate(owners) if not matched[i] and o.ready >= holder.ready]
    roomy = [i for i in away if owners[i].room]
    if roomy or (away and not any(o.room for o in owners)):
        position = _pick(owners, roomy or away, None, key.spread)
        return Choice(position, owners[position].node, Placed.MISS)
    if not away or hold is not Hold.ALLOWED:
        return None
    position = _pick(owners, away, None, key.spread)
    if not owners[position].known:
        return None
    return Choice(position, owners[position].node, Placed.MISS, hold=HOLD_MAX)


def _stays(holder: Owner, owners: Sequence[Owner]) -> bool:
    """Whether a request whose full ``holder``'s room is known waits for it in its engine:
    fewer than ``SPARE_SLOTS`` slots are known free among ``owners`` and one of its slots
    is expected to free within ``HOLD_MAX``."""
    wait = holder.wait
    if not holder.known or wait is None or wait > HOLD_MAX:
        return False
    return sum(o.free for o in owners) < SPARE_SLOTS


def _chars(ends: Sequence[int], matched: int) -> int:
    """The characters the first ``matched`` blocks cover."""
    return ends[matched - 1] if matched else 0


def _pick(owners: Sequence[Owner], pool: list[int], matched: list[int] | None, spread: int) -> int:
    """The best of ``pool``: not unloaded, most matched, least loaded, then rendezvous."""
    top = max(owners[i].ready for i in pool)
    pool = [i for i in pool if owners[i].ready == top]
    if matched is not None:
        most = max(matched[i] for i in pool)
        pool = [i for i in pool if matched[i] == most]
    lightest = min(owners[i].load for i in pool)
    best = -1
    bestScore = 0
    for scanned, position in enumerate(i for i in pool if owners[i].load == lightest):
        if scanned >= RENDEZVOUS_SCAN:
            break
        score = mix(spread ^ hash(owners[position].node.id))
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
