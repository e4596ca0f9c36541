"""Standalone mode's features on a request context (protocol §9: the proxy is its own
scheduler): the room ledger, the engines' own state, placement by cache, the fair queue with
holds and breakers (which each request's seat tells how its attempts went), and the
observer that feeds the ledger and the cache accounting.  ``useStandalone`` installs them on
the process's context and on the testing kit's fake alike, so the two are wired the same."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import attrs
from twisted.internet.interfaces import IReactorTime

from nvpair.proxy.dispatch.queueing import Queueing
from nvpair.proxy.flow.enginequeues import EngineQueues
from nvpair.proxy.flow.interfaces import IEngineQueues, IQueueing
from nvpair.proxy.hooks import RequestObserver
from nvpair.proxy.interfaces import IActivity, IExchangeReport, IRequestObserver
from nvpair.proxy.nodestate.interfaces import IEngineStates, IResidency, IRoomLedger, ModelState
from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.residency import Residency
from nvpair.proxy.nodestate.states import EngineStates
from nvpair.proxy.placement.affinity import Affinity, requestServed
from nvpair.proxy.placement.interfaces import ILoadPlanner
from nvpair.proxy.placement.loads import LoadPlanner
from nvpair.proxy.routing.reservations import ReservationMap
from nvpair.proxy.settings import Settings

__all__ = ["ResidencyObserver", "ServedObserver", "Standalone", "useStandalone"]


MAX_TRACKED = 65536  # committed requests whose first byte awaits their end's figures


def _reportedSeconds(exchange: IExchangeReport, key: str) -> float:
    """The seconds an ended exchange's engine reported in its statistic ``key`` (ms):
    ``loadMs``, the wait for its model to load (Ollama); ``promptMs``, the prompt's
    evaluation (llama.cpp); 0 when it did not say."""
    workload = exchange.workload
    stats = None if workload is None else workload.stats
    value = None if stats is None else stats.get(key)
    return value / 1000 if type(value) is float and value >= 0 else 0.0


class ServedObserver(RequestObserver):
    """At each request's end: how long it held its slot (the ledger's service time, less
    any wait its engine reported for a load), and the cached-prompt count its engine
    reported (hit ratio, confirmed misses)."""

    def __init__(self, ledger: RoomLedger, states: EngineStates, affinity: Affinity | None) -> None:
        self.ledger = ledger
        self.states = states
        self.affinity = affinity

    def requestEnded(self, exchange: IExchangeReport) -> None:
        node = exchange.servedBy
        dispatched = exchange.dispatchedAt
        if node is not None and dispatched is not None and exchange.committedStatus is not None:
            if exchange.committedStatus < 400:
                held = (
                    exchange.context.clock.seconds()
                    - dispatched
                    - _reportedSeconds(exchange, "loadMs")
                )
                self.ledger.finished(node, max(0.0, held))
        requestServed(exchange, self.states, self.affinity)


class ResidencyObserver(RequestObserver):
    """Feeds the residency view from our requests (spec §11, "Model residency").  A first
    byte on a node where the model was loading ends that load (``coldFirstByte``) and lets
    the requests waiting for it go (``RoomLedger.changed``); a warm one, with the number of
    ours for its model on the node when it was dispatched, teaches what an engine reporting
    no slots serves at once per model (``ConcurrencyEstimator.observe``, once the end says
    how much of it was a load), and what it waited inside the engine for a slot beyond
    that (``ConcurrencyEstimator.queued``) counts in its model's queue towards a further
    copy (``IQueueing.engineWaited``: before the slots are learnt, requests queue in the
    engine, not the proxy); an engine's reported load time (Ollama's ``load_duration``) is
    what the load cost."""

    def __init__(self, residency: Residency, ledger: RoomLedger, queueing: IQueueing) -> None:
        self.residency = residency
        self.ledger = ledger
        self.queueing = queueing
        self.firstBytes: dict[IExchangeReport, tuple[int, float, float]] = {}

    def committed(self, exchange: IExchangeReport, nodeId: str, firstByte: float) -> None:
        model, dispatched = exchange.model, exchange.dispatchedAt
        if not exchange.inference or model is None or dispatched is None:
            return
        seconds = exchange.context.clock.seconds() - dispatched
        if self.residency.state(nodeId, model) is ModelState.LOADING:
            self.residency.coldFirstByte(nodeId, model, seconds)
            self.ledger.changed(nodeId)
        elif len(self.firstBytes) < MAX_TRACKED:
            self.firstBytes[exchange] = (exchange.dispatchedWith, seconds, dispatched)

    def requestEnded(self, exchange: IExchangeReport) -> None:
        measured = self.firstBytes.pop(exchange, None)
        nodeId, model = exchange.servedBy, exchange.model
        status = exchange.committedStatus
        if nodeId is None or model is None or status is None or status >= 400:
            return
        load = _reportedSeconds(exchange, "loadMs")
        if load > 0:
            self.residency.loadDuration(nodeId, model, int(load * 1e9))
        if measured is None:
            return
        running, seconds, dispatched = measured
        work = load + _reportedSeconds(exchange, "promptMs")
        concurrency = self.residency.concurrency
        queued = concurrency.queued(nodeId, seconds - work if work > 0.0 else seconds)
        concurrency.observe(nodeId, running, seconds, work)
        if queued > 0.0:
            self.queueing.engineWaited(exchange.engine.id, model, queued, dispatched)


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
    residency: IResidency | None
    loads: ILoadPlanner | None
    engineQueues: IEngineQueues | None

    def observe(self, observer: IRequestObserver) -> None: ...


@attrs.frozen
class Standalone:
    """The features ``useStandalone`` installed."""

    ledger: RoomLedger
    states: EngineStates
    residency: Residency
    affinity: Affinity | None
    queueing: Queueing
    engineQueues: EngineQueues


def useStandalone(context: StandaloneContext, affinity: bool | None = None) -> Standalone:
    """Give ``context`` standalone's features: one room record per node (our requests
    there, its engine's slots, what it refused), the engines' state and which models each
    node holds, placement by cache
    (``affinity``: default ``--affinity prefix``), the fair queue and the breakers, and
    the watch that moves a request waiting in an engine's queue while another has room."""
    settings = context.settings
    ours = context.activity.inFlight
    ledger = RoomLedger(context.clock, ours)
    states = EngineStates(context.clock, ledger)
    residency = states.residency = Residency(context.clock, states, ledger)
    ledger.parallel = residency.nodeParallel
    context.activity.listener = _listener(ledger, residency)
    placing = None
    if settings.affinity == "prefix" if affinity is None else affinity:
        placing = Affinity(context.clock, context.reservations, ledger, states, residency=residency)
    loads = LoadPlanner(residency, ledger)
    queueing = Queueing(settings, context.clock, ledger, loads)
    context.ledger, context.engineStates = ledger, states
    context.affinity, context.queueing = placing, queueing
    context.residency, context.loads = residency, loads
    engineQueues = context.engineQueues = EngineQueues(context.clock, ledger, states, residency)
    context.observe(ServedObserver(ledger, states, placing))
    context.observe(ResidencyObserver(residency, ledger, queueing))
    return Standalone(ledger, states, residency, placing, queueing, engineQueues)


def _listener(ledger: RoomLedger, residency: Residency) -> Callable[[str, int, str | None], None]:
    """``Activity``'s listener: our requests per model for the residency view, then our
    in-flight count for the ledger (which may let waiting requests go)."""

    def changed(nodeId: str, delta: int, model: str | None) -> None:
        if model is not None:
            (residency.began if delta > 0 else residency.ended)(nodeId, model)
        ledger.activityChanged(nodeId, delta)

    return changed
