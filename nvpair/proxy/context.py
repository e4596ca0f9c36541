"""The request context: the process-wide state every request draws on and reports to.

Front doors, exchanges, peer requests and fleet views hold this object (typed by
``interfaces.IRequestContext``), never the process: the reservation map, in-flight counts
and workload events they update, the upstream pool and stall watches they use, and the
hooks that turn their outcomes into metrics, history and broker reports.
"""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from nvpair.proxy.broker.activity import Activity
from nvpair.proxy.broker.workloads import WorkloadReporter
from nvpair.proxy.cluster.membership import ClusterTrust
from nvpair.proxy.dispatch.queueing import Queueing
from nvpair.proxy.dispatch.relay import forwardHeaders
from nvpair.proxy.dispatch.stallwatch import StallWatches
from nvpair.proxy.engines import Engine
from nvpair.proxy.flow.interfaces import IEngineQueues
from nvpair.proxy.hooks import ObservedContext, RequestObserver, TraceObserver
from nvpair.proxy.http.interfaces import IServerRequest
from nvpair.proxy.http.site import sendError
from nvpair.proxy.interfaces import (
    IAttemptReport,
    IBrokerSink,
    IExchangeReport,
    InFlight,
    IRequestContext,
    IUpstream,
)
from nvpair.proxy.logswitch import ILogControl
from nvpair.proxy.nodestate.interfaces import IResidency
from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.states import EngineStates
from nvpair.proxy.ops.history import History
from nvpair.proxy.ops.interfaces import IOpsContext
from nvpair.proxy.ops.metrics import Metrics
from nvpair.proxy.placement.affinity import Affinity
from nvpair.proxy.placement.interfaces import ILoadPlanner
from nvpair.proxy.placement.responses import ResponseTable
from nvpair.proxy.routing.reservations import ReservationMap
from nvpair.proxy.runtime.logs import LogControl
from nvpair.proxy.settings import Settings
from nvpair.proxy.tracing.interfaces import ITracer


class HistoryObserver(RequestObserver):
    """Feeds the traffic history: every attempt's outcome per node."""

    def __init__(self, history: History) -> None:
        self.history = history

    def attemptFailed(self, exchange: IExchangeReport, outcome: IAttemptReport) -> None:
        self.history.attempt(exchange.engine.id, outcome.node.id, outcome.kind, outcome.status)

    def committed(self, exchange: IExchangeReport, nodeId: str, firstByte: float) -> None:
        self.history.attempt(exchange.engine.id, nodeId, None, None)


class DebugObserver(RequestObserver):
    """Logs each failed attempt at ``debug`` (built only while debug is on)."""

    log = Logger()

    def __init__(self, logControl: ILogControl) -> None:
        self.logControl = logControl

    def attemptFailed(self, exchange: IExchangeReport, outcome: IAttemptReport) -> None:
        if self.logControl.enabled("debug"):
            self.log.debug(
                "attempt-failed",
                engine=exchange.engine.id,
                node=outcome.node.id,
                kind=outcome.kind,
                status=outcome.status,
            )


@implementer(IRequestContext, IOpsContext)
class RequestContext(ObservedContext):
    """The one request context of a process; its hooks go to its observers (the metrics,
    the history, the traces with ``--otel``, debug logs, and standalone's features)."""

    log = Logger()

    def __init__(
        self,
        settings: Settings,
        clock: IReactorTime,
        upstream: IUpstream,
        sink: IBrokerSink,
        metrics: Metrics,
        logControl: LogControl,
        trust: ClusterTrust | None = None,
        tracer: ITracer | None = None,
    ) -> None:
        super().__init__(metrics.hookFailed)
        self.settings = settings
        self.clock = clock
        self.upstream = upstream
        self.sink = sink
        self.metrics = metrics
        self.logControl = logControl
        self.trust = trust
        self.tracer = tracer  # None unless --otel: then exchanges carry a ``trace``
        self.reservations = ReservationMap()
        self.responses = ResponseTable(clock)  # follow-ups go where their predecessor is
        self.activity = Activity(sink)
        self.history = History(clock)
        self.reporter = WorkloadReporter(sink, clock, ends=self.history)
        self.stalls = StallWatches(clock, settings.streamIdleTimeout)
        # Standalone sets these (``features.useStandalone``): the room ledger, the engines'
        # own state, placement by cache (with ``--affinity prefix``), the queue and breakers.
        self.engineQueues: IEngineQueues | None = None  # standalone's
        self.ledger: RoomLedger | None = None
        self.engineStates: EngineStates | None = None
        self.affinity: Affinity | None = None
        self.queueing: Queueing | None = None
        self.residency: IResidency | None = None
        self.loads: ILoadPlanner | None = None
        self.exchanges: set[InFlight] = set()
        self.observe(metrics)
        self.observe(HistoryObserver(self.history))
        self.observe(DebugObserver(logControl))
        if tracer is not None:
            self.observe(TraceObserver())

    forwardHeaders = staticmethod(forwardHeaders)

    def sendError(
        self,
        request: IServerRequest,
        engine: Engine,
        status: int,
        reason: str,
        message: str,
        retryAfter: int | None = None,
    ) -> None:
        """Answer with a proxy-generated error (``site.sendError``), counting it by reason."""
        self.metrics.proxyError(engine.id, reason)
        sendError(request, engine, status, reason, message, retryAfter)

    def reportInternal(self, exceptionType: str) -> None:
        """An unexpected exception handling a request (names the type only)."""
        self.metrics.internalError()
        self.sink.notify(
            "errors:report", {"kind": "internal", "message": f"unexpected {exceptionType}"}
        )
