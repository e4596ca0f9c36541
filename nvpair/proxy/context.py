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
from nvpair.proxy.nodestate.states import EngineStates
from nvpair.proxy.ops.history import History
from nvpair.proxy.ops.interfaces import IOpsContext
from nvpair.proxy.ops.metrics import Metrics
from nvpair.proxy.placement.affinity import Affinity, requestServed
from nvpair.proxy.routing.reservations import ReservationMap
from nvpair.proxy.runtime.logs import LogControl
from nvpair.proxy.settings import Settings
from nvpair.proxy.tracing.interfaces import ITracer


@implementer(IRequestContext, IOpsContext)
class RequestContext:
    """The one request context of a process."""

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
        self.settings = settings
        self.clock = clock
        self.upstream = upstream
        self.sink = sink
        self.metrics = metrics
        self.logControl = logControl
        self.trust = trust
        self.tracer = tracer  # None unless --otel: then exchanges carry a ``trace``
        self.reservations = ReservationMap()
        self.activity = Activity(sink)
        self.history = History(clock)
        self.reporter = WorkloadReporter(sink, clock, ends=self.history)
        self.stalls = StallWatches(clock, settings.streamIdleTimeout)
        # Standalone with ``--affinity prefix`` sets this (the proxy then orders candidates).
        self.affinity: Affinity | None = None
        # Standalone sets these: the engines' own state (polled), and the queue and breakers.
        self.engineStates: EngineStates | None = None
        self.queueing: Queueing | None = None
        self.exchanges: set[InFlight] = set()

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

    def attemptFailed(self, exchange: IExchangeReport, outcome: IAttemptReport) -> None:
        """An attempt ended uncommitted."""
        self.metrics.attemptFailed(exchange, outcome)
        if self.queueing is not None:
            self.queueing.attemptFailed(
                outcome.node.id, outcome.kind, outcome.status, outcome.retryAfter
            )
        self.history.attempt(exchange.engine.id, outcome.node.id, outcome.kind, outcome.status)
        if exchange.trace is not None:
            exchange.trace.attemptFailed(outcome)
        if self.logControl.enabled("debug"):
            self.log.debug(
                "attempt-failed",
                engine=exchange.engine.id,
                node=outcome.node.id,
                kind=outcome.kind,
                status=outcome.status,
            )

    def committed(self, exchange: IExchangeReport, nodeId: str) -> None:
        """A response committed on ``nodeId``."""
        firstByte = self.clock.seconds() - exchange.createdAt
        self.metrics.committed(exchange, nodeId, firstByte)
        if self.queueing is not None:
            self.queueing.committed(nodeId, exchange.committedStatus)
        self.history.attempt(exchange.engine.id, nodeId, None, None)
        if exchange.trace is not None:
            exchange.trace.committed(nodeId, firstByte)

    def requestEnded(self, exchange: IExchangeReport) -> None:
        """An exchange ended (its terminal bookkeeping has run)."""
        self.metrics.requestEnded(exchange)
        if self.engineStates is not None:
            requestServed(exchange, self.engineStates, self.affinity)
        if exchange.trace is not None:
            exchange.trace.ended(exchange)

    def streamStalled(self, engineId: str) -> None:
        """A committed stream was cut by its stall watch."""
        self.metrics.streamStalled(engineId)
