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
   full until its load is done), unless the wait predicted for the model's copies, warm
   and loading, exceeds what a load elsewhere costs: then the best cold owner alone, where
   the request starts *a further copy*.  The predicted wait is ``(ahead + 1)`` over the
   sum of the copies' ``capacity / service time`` (a loading copy counted at the warm
   copies' mean rate); unknown when a warm
   copy's capacity or service time is not known yet, and then nothing spills (stay warm
   when uncertain).  A spill never evicts a busy model, nor the only copy of a model with
   demand (at least ``IDLE_DEMAND`` requests a minute over the fleet); evicting a copy of
   a model resident elsewhere costs its load time times the share of its demand served
   on that node.
3. **No warm owner, one loading**: the loading owners: the request waits in the proxy for
   the load to finish (no further copy: no copy's rate is known yet).
4. **Cold everywhere**: exactly one owner, the cheapest to load on: no eviction (room
   known) first, then nothing known of its room, then evicting an idle model resident
   elsewhere, then the only copy of an idle model (least fleet demand first), then a busy
   one (the load waits); within a tier a node with a free slot first, then the least victim
   demand, the fastest load, then rendezvous hashing on the model, so a burst for one model
   picks one node.

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
from nvpair.proxy.placement.interfaces import ILoadPlanner
from nvpair.proxy.routing.nodes import Node

__all__ = ["IDLE_DEMAND", "LoadPlan", "LoadPlanner", "Tier"]

IDLE_DEMAND = 0.1  # requests per minute over the fleet: below it a model is unused lately

_WARM = (ModelState.LOADED, ModelState.UNKNOWN)


class Tier(IntEnum):
    """How a load on a node would make its room, cheapest first."""

    ROOM = 0  # the node has room for one more model
    UNKNOWN = 1  # nothing known of what it can hold
    COPY = 2  # it evicts an idle model resident elsewhere too
    ONLY = 3  # it evicts the only copy of an idle model
    BUSY = 4  # every resident model is busy: the load waits for one to go idle


@attrs.frozen
class LoadPlan:
    """The owners a request may go to now, and the one where it would start a load."""

    usable: tuple[Node, ...]
    load: Node | None = None


@attrs.frozen
class _Cold:
    """A cold owner, what loading there costs (seconds) and its order key."""

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

    def plan(self, owners: Sequence[Node], model: str, ahead: int) -> LoadPlan:
        """The owners a request for ``model`` may use now, ``ahead`` requests for it waiting
        in the proxy before it, and where it would start a load."""
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
            _dbg("cold", model, owners, state, ahead, best, self)
            return LoadPlan((best.node,), best.node)
        spill = self._spill(warm, loading, cold, model, ahead)
        if spill is not None:
            _dbg("spill", model, owners, state, ahead, self._cold(spill, model), self)
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
        charge = 0.0
        if eviction is not None and tier is Tier.COPY and eviction.fleetDemand > 0:
            share = min(1.0, eviction.demand / eviction.fleetDemand)
            charge = residency.loadSeconds(nodeId, eviction.model) * share
        rendezvous = float(mix(hash((model, nodeId))))
        full = float(self.ledger.knownFull(nodeId))  # the load would wait for a slot
        key = (tier, full, round(demand, 1), seconds, rendezvous)
        return _Cold(node, tier, seconds + charge, key)

    def _spill(
        self,
        warm: Sequence[Node],
        loading: Sequence[Node],
        cold: Sequence[Node],
        model: str,
        ahead: int,
    ) -> Node | None:
        """The cold owner to load a further copy on (rules 2 and 3), or None."""
        if not cold or not warm:
            return None  # no copy serves yet: its rate is not known
        rates = [self._rate(node.id) for node in warm]
        if any(rate is None for rate in rates):
            return None
        known = [rate for rate in rates if rate is not None]
        total = sum(known) + len(loading) * sum(known) / len(known)
        if total <= 0:
            return None
        best = self.cheapest(cold, model)
        if best.tier is Tier.BUSY:
            return None
        if best.tier is Tier.ONLY:
            eviction = self.residency.likelyEviction(best.node.id, model)
            if eviction is None or eviction.fleetDemand >= IDLE_DEMAND:
                return None
        wait = (ahead + 1) / total
        return best.node if wait > best.seconds else None

    def _rate(self, nodeId: str) -> float | None:
        """Requests a second ``nodeId`` serves (capacity / service time), if known."""
        capacity = self.ledger.capacity(nodeId)
        service = self.ledger.serviceTime(nodeId)
        if capacity is None or service is None or service <= 0:
            return None
        return capacity / service


def _tier(eviction: Eviction | None, room: int | None) -> Tier:
    if eviction is None:  # it fits (by count or by bytes), or nothing is known
        return Tier.UNKNOWN if room is None else Tier.ROOM
    if not eviction.idle:
        return Tier.BUSY
    return Tier.COPY if eviction.copies > 1 else Tier.ONLY


def _dbg(kind, model, owners, state, ahead, best, planner):  # type: ignore[no-untyped-def]
    import time

    with open("/tmp/plan.log", "a") as f:
        f.write(
            f"{time.time():.2f} {kind} {model} ahead={ahead} -> {best.node.id[-5:]} tier={best.tier.name} "
            + " ".join(
                f"{n.id[-5:]}:{state(n.id, model).value}:{planner.residency.room(n.id)}:{planner.ledger.free(n.id)}"
                for n in owners
            )
            + f" ev={planner.residency.likelyEviction(best.node.id, model)}\n"
        )
