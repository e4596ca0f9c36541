"""Placement that counts loads (spec §11, "Placement that counts loads"): which of a model's
owners a request may use now, given which of them hold the model, what a load would cost
and what it would evict.  Standalone mode only, whatever ``--affinity`` says.

Each owner is *warm* (its engine has the model loaded, or says nothing of models: an engine
that serves one model, or one whose state is not known now), *loading* (the engine says
so, or the proxy started a load there that is not done), or *cold* (not resident, or a
router's sleeping child).  ``LoadPlanner.plan`` answers the owners a request may go to
(``usable``) and, when it is to start a load, where (``load``):

1. **Warm with room**: the warm owners only.
2. **Warm, every one full**: wait for them (in the fair queue: a loading owner counts as
   full until its load is done), unless the copies' queue stays longer than a load
   elsewhere: then the best cold owner alone, where the request starts *a further copy*.
   The queue stays longer than a load when what the model's requests waited in the proxy
   since its last load started (``Backlog.waited``, decayed over a minute) exceeds a
   load's seconds times the copies there are, no copy loading; or when the wait predicted
   for this request does: ``(ahead + 1)`` over the sum of the copies' ``capacity /
   service time`` (a loading copy at the warm copies' mean rate; unknown while a warm
   copy's capacity or service time is, and then nothing spills on it: stay warm when
   uncertain).  A further copy goes only where there is room: room known, or a node not
   known to be full that holds fewer models than another owner was seen holding, or in
   place of an idle copy of a model resident elsewhere, one not used there lately (under
   ``IDLE_DEMAND`` requests a minute) or whose demand per copy is under ``1 /
   SHARE_MARGIN`` of this model's per copy with one more (the order bin-packing by
   popularity gives); never a busy model, never the only copy of one.
3. **No warm owner, one loading**: the loading owners: the request waits in the proxy for
   the load to finish (no further copy: no copy's rate is known yet).
4. **Cold everywhere**: exactly one owner, the cheapest to load on: room known for one
   more model first, then not known to be full (never seen evicting), then evicting an
   idle model resident elsewhere, then the only copy of an idle model (least fleet demand
   first), then a busy one (the load waits); within a tier a node with a free slot first,
   then the one holding fewest models, the least victim demand, the fastest load, then
   rendezvous hashing on the model, so a burst for one model picks one node.

A request sent to its ``load`` node marks the model loading there at once
(``IResidency.loadStarted``), so the next requests wait for that load instead of starting
others.  Pure: it reads ``IResidency`` and ``IRoomLedger``, never the clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

import attrs
from zope.interface import implementer

from nvpair.proxy.nodestate.interfaces import Eviction, IResidency, IRoomLedger, ModelState
from nvpair.proxy.placement.choose import mix
from nvpair.proxy.placement.interfaces import Backlog, ILoadPlanner, LoadPlan
from nvpair.proxy.routing.nodes import Node

__all__ = ["IDLE_DEMAND", "SHARE_MARGIN", "LoadPlanner", "Tier"]

IDLE_DEMAND = 0.1  # requests a minute: below it a model is not used lately
SHARE_MARGIN = 1.5  # a copy gives way to a model with this much more demand per copy

_WARM = (ModelState.LOADED, ModelState.UNKNOWN)


class Tier(IntEnum):
    """How a load on a node would make its room, cheapest first."""

    ROOM = 0  # the node has room for one more model
    UNKNOWN = 1  # not known to be full (never seen evicting), nor to have room
    COPY = 2  # it evicts an idle model resident elsewhere too
    ONLY = 3  # it evicts the only copy of an idle model
    BUSY = 4  # every resident model is busy: the load waits for one to go idle


@attrs.frozen
class _Cold:
    """A cold owner, how it would make room, the seconds a load there takes, its order."""

    node: Node
    tier: Tier
    seconds: float
    key: tuple[float, ...]


@implementer(ILoadPlanner)
class LoadPlanner:
    """Placement that counts loads (the module docstring says the rule)."""

    def __init__(self, residency: IResidency, ledger: IRoomLedger) -> None:
        self.residency = residency
        self.ledger = ledger

    def loading(self, nodeId: str, model: str) -> bool:
        """Whether ``model`` is loading on ``nodeId`` (no room for it there until loaded)."""
        return self.residency.state(nodeId, model) is ModelState.LOADING

    def plan(self, owners: Sequence[Node], model: str, backlog: Backlog) -> LoadPlan:
        """The owners a request for ``model`` may use now (``backlog``: its queue in the
        proxy), and where it would start a load."""
        state = self.residency.state
        warm: list[Node] = []
        loading: list[Node] = []
        cold: list[Node] = []
        for node in owners:
            found = state(node.id, model)
            (warm if found in _WARM else loading if found is ModelState.LOADING else cold).append(
                node
            )
        if not loading and not cold:
            return LoadPlan(tuple(owners))
        full = self.ledger.knownFull
        if any(not full(node.id) for node in warm):
            return LoadPlan(tuple(warm))
        copies = (*warm, *loading)
        if not copies:
            best = self.cheapest(cold, model)
            return LoadPlan((best.node,), best.node)
        spill = self._spill(warm, loading, cold, model, backlog)
        if spill is not None:
            return LoadPlan((spill,), spill)
        return LoadPlan(copies)

    def cheapest(self, cold: Sequence[Node], model: str) -> _Cold:
        """The cold owner where loading ``model`` costs least (rule 4)."""
        return min((self._cold(node, model) for node in cold), key=lambda c: c.key)

    def _cold(self, node: Node, model: str) -> _Cold:
        residency = self.residency
        nodeId = node.id
        seconds = residency.loadSeconds(nodeId, model)
        eviction = residency.likelyEviction(nodeId, model)
        tier = _tier(eviction, residency.room(nodeId))
        demand = 0.0 if eviction is None else eviction.fleetDemand
        rendezvous = float(mix(hash((model, nodeId))))
        full = float(self.ledger.knownFull(nodeId))  # the load would wait for a slot
        key = (tier, full, residency.held(nodeId), round(demand, 1), seconds, rendezvous)
        return _Cold(node, tier, seconds, key)

    def _spill(
        self,
        warm: Sequence[Node],
        loading: Sequence[Node],
        cold: Sequence[Node],
        model: str,
        backlog: Backlog,
    ) -> Node | None:
        """The cold owner to load a further copy on (rule 2), or None."""
        if not cold or not warm:
            return None  # no copy serves yet: its rate is not known
        best = self.cheapest(cold, model)
        copies = len(warm) + len(loading)
        if not self._spillable(best, model, (*warm, *loading, *cold), copies):
            return None
        if not loading and backlog.waited > best.seconds * copies:
            return best.node  # the copies' queue stayed longer than a load
        rates = [self._rate(node.id) for node in warm]
        known = [rate for rate in rates if rate is not None]
        if len(known) < len(rates) or sum(known) <= 0:
            return None  # stay warm when uncertain
        total = sum(known) * copies / len(known)
        return best.node if (backlog.ahead + 1) / total > best.seconds else None

    def _spillable(self, best: _Cold, model: str, owners: Sequence[Node], copies: int) -> bool:
        """Whether a further copy may go where ``best`` says: where there is room, or a
        node not known to be full that holds fewer models than another owner was seen
        holding, or in place of an idle copy of a model resident elsewhere that was not
        used there lately or whose demand per copy is under ``1 / SHARE_MARGIN`` of what
        this model's would be with one more (as bin-packing by popularity would place
        them); never evicting a busy model or the only copy of one."""
        if best.tier is Tier.ROOM:
            return True
        if best.tier is Tier.UNKNOWN:
            residency = self.residency
            most = max(residency.mostHeld(node.id) for node in owners)
            return residency.held(best.node.id) < most
        if best.tier is not Tier.COPY:
            return False
        residency = self.residency
        eviction = residency.likelyEviction(best.node.id, model)
        if eviction is None or eviction.demand < IDLE_DEMAND:
            return eviction is not None
        theirs = eviction.fleetDemand / max(1, eviction.copies)
        return theirs * SHARE_MARGIN < residency.demand(model) / (copies + 1)

    def _rate(self, nodeId: str) -> float | None:
        """Requests a second ``nodeId`` serves (capacity / service time), if known."""
        capacity = self.ledger.capacity(nodeId)
        service = self.ledger.serviceTime(nodeId)
        if capacity is None or service is None or service <= 0:
            return None
        return capacity / service


def _tier(eviction: Eviction | None, room: int | None) -> Tier:
    if eviction is None:  # room for one more, or not known to be full
        return Tier.ROOM if room is not None and room > 0 else Tier.UNKNOWN
    if not eviction.idle:
        return Tier.BUSY
    return Tier.COPY if eviction.copies > 1 else Tier.ONLY
