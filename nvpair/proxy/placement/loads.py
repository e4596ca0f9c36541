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
   elsewhere: then the cheapest cold owner where it does and a further copy may go
   (below) alone, where the request starts *a further copy*.
   The queue stays longer than a load when what the model's requests waited in the proxy
   since its last load started (``Backlog.waited``, decayed over a minute) exceeds a
   load's seconds times the copies there are, times ``SPILL_WAIT`` (where the copy goes
   and what it may evict, the rules below decide), no copy loading; or when the wait
   predicted for this request does: ``(ahead + 1)`` over the sum of the copies' ``capacity /
   service time`` (a loading copy at the warm copies' mean rate; unknown while a warm
   copy's capacity or service time is, and then nothing spills on it: stay warm when
   uncertain).  A further copy goes only where there is room: room known, or a node not
   known to be full that holds fewer models than another owner was seen holding (either
   only while no resident model's demand per copy with one more, ``neediest``, exceeds
   this model's by ``GIVE_WAY``: the room is for the model most in need), or in
   place of a copy of a model resident elsewhere: an idle one not used there lately
   (under ``IDLE_DEMAND`` requests a minute), or an idle or busy one whose demand per
   copy is under ``1 / GIVE_WAY`` of this model's per copy with one more (the order
   bin-packing by popularity gives; a busy copy drains first); the only copy of a model
   under ``1 / SHARE_MARGIN`` of it only while another node has room for it that is not
   for a model more in need (as above: it moves there, its next request loads it), else
   never.
3. **No warm owner, one loading**: the loading owners: the request waits in the proxy for
   the load to finish (no further copy: no copy's rate is known yet).
4. **Cold everywhere**: exactly one owner, the cheapest to load on: room known for one
   more model first, then not known to be full (never seen evicting), then evicting an
   idle model resident elsewhere, then the only copy of an idle model (least fleet demand
   first), then draining a busy copy of a model resident elsewhere, then a busy one (the
   load waits); within an evicting tier a node with a free slot first, then the one
   holding fewest models, the least victim demand; within a tier with room the one
   holding fewest models, then the one whose resident models have the most fleet demand
   per copy (``IResidency.residentDemand``: the room left stays beside less popular
   models, where a further copy of a popular one belongs; a model in as much demand as
   any they hold goes the other way, as a further copy), then a free slot; then the
   fastest load, then rendezvous hashing on the model, so a burst for one model picks one
   node.  A further copy (rule 2) with room takes the opposite order of demand: beside
   the least popular models, as bin-packing by popularity pairs them.

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

__all__ = ["GIVE_WAY", "IDLE_DEMAND", "SHARE_MARGIN", "SPILL_WAIT", "LoadPlanner", "Tier"]

IDLE_DEMAND = 0.1  # requests a minute: below it a model is not used lately
SHARE_MARGIN = 1.5  # a copy gives way to a model with this much more demand per copy
GIVE_WAY = 1.25  # SHARE_MARGIN for a copy of a model that keeps another copy
SPILL_WAIT = 0.25  # of a load's seconds per copy, waited: enough for a further copy

_WARM = (ModelState.LOADED, ModelState.UNKNOWN)


class Tier(IntEnum):
    """How a load on a node would make its room, cheapest first."""

    ROOM = 0  # the node has room for one more model
    UNKNOWN = 1  # not known to be full (never seen evicting), nor to have room
    COPY = 2  # it evicts an idle model resident elsewhere too
    ONLY = 3  # it evicts the only copy of an idle model
    DISPLACE = 4  # it drains and evicts a busy copy of a model resident elsewhere
    BUSY = 5  # every resident model is busy, each the only copy: the load waits


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

    def noRoom(self, nodeId: str, model: str) -> bool:
        residency = self.residency
        return residency.modelFull(nodeId, model) or self.loading(nodeId, model)

    def warm(self, owners: Sequence[Node], model: str) -> bool:
        state = self.residency.state
        for node in owners:
            if state(node.id, model) not in _WARM:
                return False
        return True

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
        full, modelFull = self.ledger.knownFull, self.residency.modelFull
        if any(not full(node.id) and not modelFull(node.id, model) for node in warm):
            return LoadPlan(tuple(warm))
        copies = (*warm, *loading)
        if not copies:
            best = self.cheapest(cold, model)
            return LoadPlan((best.node,), best.node)
        spill = self._spill(warm, loading, cold, model, backlog)
        if spill is not None:
            return LoadPlan((spill,), spill)
        return LoadPlan(copies)

    def cheapest(self, cold: Sequence[Node], model: str, further: bool = False) -> _Cold:
        """The cold owner where loading ``model`` costs least (rule 4; ``further``: a
        further copy, rule 2).  A first copy of a model in as much demand as any model
        those owners hold goes where a further copy would: beside the least popular."""
        if not further:
            pulls = [self.residency.residentDemand(node.id) for node in cold]
            further = self.residency.demand(model) >= max(pulls, default=0.0)
        return min((self._cold(node, model, further) for node in cold), key=lambda c: c.key)

    def _cold(self, node: Node, model: str, further: bool) -> _Cold:
        residency = self.residency
        nodeId = node.id
        seconds = residency.loadSeconds(nodeId, model)
        eviction = residency.likelyEviction(nodeId, model)
        tier = _tier(eviction, residency.room(nodeId))
        rendezvous = float(mix(hash((model, nodeId))))
        full = float(self.ledger.knownFull(nodeId))  # the load would wait for a slot
        held = float(residency.held(nodeId))
        key: tuple[float, ...]
        if eviction is None:  # room: pair by popularity (the module docstring says how)
            pull = round(residency.residentDemand(nodeId), 1)
            key = (tier, held, pull if further else -pull, full, seconds, rendezvous)
        else:
            demand = round(eviction.fleetDemand, 1)
            key = (tier, full, held, demand, seconds, rendezvous)
        return _Cold(node, tier, seconds, key)

    def _spill(
        self,
        warm: Sequence[Node],
        loading: Sequence[Node],
        cold: Sequence[Node],
        model: str,
        backlog: Backlog,
    ) -> Node | None:
        """The cold owner to load a further copy on (rule 2): the cheapest where the
        copies' queue outlasted a load and one may go (checked in that order: the first
        is cheap), or None."""
        if not cold or not warm:
            return None  # no copy serves yet: its rate is not known
        copies = len(warm) + len(loading)
        owners = (*warm, *loading, *cold)
        predicted = self._predicted(warm, model, copies, backlog)
        for best in sorted((self._cold(node, model, True) for node in cold), key=lambda c: c.key):
            waited = not loading and backlog.waited > best.seconds * copies * SPILL_WAIT
            if (waited or predicted > best.seconds) and self._spillable(
                best, model, owners, copies
            ):
                return best.node
        return None

    def _predicted(self, warm: Sequence[Node], model: str, copies: int, backlog: Backlog) -> float:
        """The wait predicted for the next request: ``(ahead + 1)`` over the copies' rate
        (a loading copy at the warm copies' mean); 0 while a warm copy's rate is unknown
        (stay warm when uncertain)."""
        rates = [self._rate(node.id, model) for node in warm]
        known = [rate for rate in rates if rate is not None]
        if len(known) < len(rates) or sum(known) <= 0:
            return 0.0
        return (backlog.ahead + 1) / (sum(known) * copies / len(known))

    def _spillable(self, best: _Cold, model: str, owners: Sequence[Node], copies: int) -> bool:
        """Whether a further copy may go where ``best`` says: where there is room, or a
        node not known to be full that holds fewer models than another owner was seen
        holding, when no resident model's demand per copy with one more exceeds this
        one's by ``GIVE_WAY`` (the room goes to the model bin-packing would give it to,
        by the margin a copy gives way at), or in place of a copy of a model resident
        elsewhere: an idle one not used there lately, or one (idle or busy: it drains)
        whose demand per copy is under ``1 / GIVE_WAY`` of what this model's would be
        with one more (as bin-packing by popularity would place them); the only copy of
        a model under ``1 / SHARE_MARGIN`` of it only while another node has room for it,
        and that room is not for a model more in need (as free room)."""
        residency = self.residency
        ours = residency.demand(model) / (copies + 1)
        # Free room, or the room an only copy would move into, is for the model most in need.
        needier = ours * GIVE_WAY < residency.neediest()
        if best.tier <= Tier.UNKNOWN:
            if needier:
                return False
            if best.tier is Tier.ROOM:
                return True
            most = max(residency.mostHeld(node.id) for node in owners)
            return residency.held(best.node.id) < most
        eviction = residency.likelyEviction(best.node.id, model)
        if eviction is None:
            return False
        if eviction.copies <= 1:  # the only copy moves into the room elsewhere, or stays
            if needier or not residency.roomElsewhere(best.node.id):
                return False
            margin = SHARE_MARGIN
        elif eviction.idle and eviction.demand < IDLE_DEMAND:
            return True
        else:
            margin = GIVE_WAY
        return eviction.fleetDemand / max(1, eviction.copies) * margin < ours

    def _rate(self, nodeId: str, model: str) -> float | None:
        """Requests for ``model`` a second ``nodeId`` serves (capacity / service time), if
        known; the capacity is the model's own parallel slots where they are per model."""
        capacity = self.ledger.capacity(nodeId)
        perModel = self.residency.parallel(nodeId, model)
        if perModel is not None and (capacity is None or perModel < capacity):
            capacity = perModel
        service = self.ledger.serviceTime(nodeId)
        if capacity is None or service is None or service <= 0:
            return None
        return capacity / service


def _tier(eviction: Eviction | None, room: int | None) -> Tier:
    if eviction is None:  # room for one more, or not known to be full
        return Tier.ROOM if room is not None and room > 0 else Tier.UNKNOWN
    if not eviction.idle:
        return Tier.DISPLACE if eviction.copies > 1 else Tier.BUSY
    return Tier.COPY if eviction.copies > 1 else Tier.ONLY
