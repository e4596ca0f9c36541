"""Standalone mode's features on a request context (protocol §9: the proxy is its own
scheduler): the room ledger, the engines' own state, placement by cache, the fair queue with
holds and breakers (which each request's seat tells how its attempts went), and the
observer that feeds the ledger and the cache accounting.  ``useStandalone`` installs them on
the process's context and on the testing kit's fake alike, so the two are wired the same."""

from __future__ import annotations

from typing import Protocol

import attrs
from twisted.internet.interfaces import IReactorTime

from nvpair.proxy.dispatch.queueing import Queueing
from nvpair.proxy.flow.interfaces import IQueueing
from nvpair.proxy.hooks import RequestObserver
from nvpair.proxy.interfaces import IActivity, IExchangeReport, IRequestObserver
from nvpair.proxy.nodestate.interfaces import IEngineStates, IRoomLedger
from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.residency import Residency
from nvpair.proxy.nodestate.states import EngineStates
from nvpair.proxy.placement.affinity import Affinity, requestServed
from nvpair.proxy.routing.reservations import ReservationMap
from nvpair.proxy.settings import Settings

__all__ = ["ServedObserver", "Standalone", "useStandalone"]


class ServedObserver(RequestObserver):
    """At each request's end: how long it held its slot (the ledger's service time), and
    the cached-prompt count its engine reported (hit ratio, confirmed misses)."""

    def __init__(self, ledger: RoomLedger, states: EngineStates, affinity: Affinity | None) -> None:
        self.ledger = ledger
        self.states = states
        self.affinity = affinity

    def requestEnded(self, exchange: IExchangeReport) -> None:
        node = exchange.servedBy
        dispatched = exchange.dispatchedAt
        if node is not None and dispatched is not None and exchange.committedStatus is not None:
            if exchange.committedStatus < 400:
                self.ledger.finished(node, exchange.context.clock.seconds() - dispatched)
        requestServed(exchange, self.states, self.affinity)


class StandaloneContext(Protocol):
    """What ``useStandalone`` needs of a request context (``context.RequestContext``, the
    kit's ``fakecontext.FakeContext``)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def clock(self) -> IReactorTime: ...
    @property
    def activity(self) -> IActivity: ...
    @property
    def reservations(self) -> ReservationMap: ...

    ledger: IRoomLedger | None
    engineStates: IEngineStates | None
    affinity: Affinity | None
    queueing: IQueueing | None

    def observe(self, observer: IRequestObserver) -> None: ...


@attrs.frozen
class Standalone:
    """The features ``useStandalone`` installed."""

    ledger: RoomLedger
    states: EngineStates
    residency: Residency
    affinity: Affinity | None
    queueing: Queueing


def useStandalone(context: StandaloneContext, affinity: bool | None = None) -> Standalone:
    """Give ``context`` standalone's features: one room record per node (our requests
    there, its engine's slots, what it refused), the engines' state and which models each
    node holds, placement by cache
    (``affinity``: default ``--affinity prefix``), the fair queue and the breakers."""
    settings = context.settings
    ledger = RoomLedger(context.clock, context.activity.inFlight)
    context.activity.listener = ledger.activityChanged
    states = EngineStates(context.clock, ledger)
    residency = states.residency = Residency(context.clock, states, ledger)
    placing = None
    if settings.affinity == "prefix" if affinity is None else affinity:
        placing = Affinity(context.clock, context.reservations, ledger, states)
    queueing = Queueing(settings, context.clock, ledger)
    context.ledger, context.engineStates = ledger, states
    context.affinity, context.queueing = placing, queueing
    context.observe(ServedObserver(ledger, states, placing))
    return Standalone(ledger, states, residency, placing, queueing)
