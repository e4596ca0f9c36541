"""Fakes of the request context's seam (``interfaces.IRequestContext``) for unit tests.

``FakeContext`` is what a request draws on and reports to: real reservations, activity,
workloads and stall watches over a ``ListSink`` and a ``Clock``; the settings are the
protocol defaults overridden by keyword (``makeSettings``); the upstream is an
``upstreamspy.UpstreamSpy`` unless a test brings its own; every report (internal errors,
generated errors, failed attempts, commits, ends, stalls) is recorded in ``record``; with a
``tracer`` the hooks feed an exchange's trace as ``context.RequestContext`` does.
``ExchangeReport`` is what its hooks read of an exchange, as a record.  Its hooks fan out
to observers exactly as the process's do (``hooks.ObservedContext``); the recorder is one of
them, and ``features.useStandalone(context)`` adds standalone's features as in the process.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast, overload

import attrs
from twisted.internet.task import Clock
from zope.interface import implementer

from nvpair.proxy.broker.activity import Activity
from nvpair.proxy.broker.workloads import WorkloadReporter
from nvpair.proxy.dispatch.relay import forwardHeaders
from nvpair.proxy.dispatch.stallwatch import StallWatches
from nvpair.proxy.endings import BodyEnding
from nvpair.proxy.engines import Engine
from nvpair.proxy.flow.interfaces import IEngineQueues, IQueueing
from nvpair.proxy.hooks import ObservedContext, RequestObserver, TraceObserver
from nvpair.proxy.http.interfaces import IServerRequest
from nvpair.proxy.http.site import sendError
from nvpair.proxy.interfaces import (
    IAttemptReport,
    IBrokerSink,
    IClusterTrust,
    IExchangeReport,
    InFlight,
    IRequestContext,
    IWorkload,
)
from nvpair.proxy.nodestate.interfaces import IEngineStates, IResidency, IRoomLedger
from nvpair.proxy.placement.affinity import Affinity
from nvpair.proxy.placement.interfaces import ILoadPlanner
from nvpair.proxy.placement.keys import AffinityKey
from nvpair.proxy.placement.responses import ResponseTable
from nvpair.proxy.routing.reservations import ReservationMap
from nvpair.proxy.runtime.logs import LogControl
from nvpair.proxy.settings import Settings
from nvpair.proxy.testing.upstreamspy import UpstreamSpy
from nvpair.proxy.tracing.interfaces import IRequestTrace, ITracer

__all__ = ["RUN_ID", "ExchangeReport", "FakeContext", "ListSink", "Recorder", "makeSettings"]

RUN_ID = "0123456789abcdef"


def makeSettings(**overrides: Any) -> Settings:
    """Settings with the protocol defaults (durations in seconds), overridden as given."""
    values: dict[str, Any] = dict(
        stateDir="/nonexistent",
        clusterDir=None,
        responseHeaderTimeout=1800.0,
        jobDeadline=600.0,
        dialTimeout=10.0,
        maxDispatchAttempts=5,
        backoffBase=0.25,
        backoffMax=5.0,
        clientWriteTimeout=60.0,
        retryAfter=10,
        maxBody=1 << 26,
        logLevel="info",
        opsPort=None,
        standalone=False,
        backends=(),
        engines=("ollama", "lmstudio", "llamacpp"),
        maxConnections=4096,
        headerReadTimeout=30.0,
        maxHeaderBytes=65536,
        streamIdleTimeout=0.0,  # the stall watch is off unless a test turns it on
    )
    values.update(overrides)
    return Settings(**values)


@implementer(IBrokerSink)
class ListSink:
    """Records notifications."""

    listening = True

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self.sent.append((method, params))

    def workloadEvents(self) -> list[tuple[str, dict[str, Any]]]:
        """(method, workloadInfo) of every workload event, in order."""
        return [(m, p["workloadInfo"]) for m, p in self.sent if m.startswith("workload:")]

    def activity(self) -> list[tuple[str, int]]:
        """(nodeId, inFlight) of every ``discovery:node-activity``, in order."""
        return [
            (p["nodeId"], p["inFlight"]) for m, p in self.sent if m == "discovery:node-activity"
        ]


UpstreamT = TypeVar("UpstreamT")


@attrs.define
class Recorder(RequestObserver):
    """The context's reporting hooks, recorded (an observer of every request)."""

    internal: list[str] = attrs.Factory(list)
    errors: list[tuple[int, str]] = attrs.Factory(list)
    failedAttempts: list[IAttemptReport] = attrs.Factory(list)
    commits: list[str] = attrs.Factory(list)
    ended: list[IExchangeReport] = attrs.Factory(list)
    stalled: list[str] = attrs.Factory(list)
    hookErrors: list[str] = attrs.Factory(list)

    def attemptFailed(self, exchange: IExchangeReport, outcome: IAttemptReport) -> None:
        self.failedAttempts.append(outcome)

    def committed(self, exchange: IExchangeReport, nodeId: str, firstByte: float) -> None:
        self.commits.append(nodeId)

    def requestEnded(self, exchange: IExchangeReport) -> None:
        self.ended.append(exchange)

    def streamStalled(self, engineId: str) -> None:
        self.stalled.append(engineId)


@implementer(IRequestContext)
class FakeContext(ObservedContext, Generic[UpstreamT]):
    """What a request draws on and reports to (``RequestContext`` in production).

    ``FakeContext(**settings)`` has an ``upstreamspy.UpstreamSpy``;
    ``FakeContext(upstream=...)`` the test's own (typed as given).  ``logLevel`` (a setting)
    also sets ``logControl``.
    """

    # This one first: the other's ``**settings`` would take ``upstream`` for a setting.
    @overload
    def __init__(
        self,
        clock: Clock | None = None,
        *,
        upstream: UpstreamT,
        trust: IClusterTrust | None = None,
        tracer: ITracer | None = None,
        **settings: object,
    ) -> None: ...

    @overload
    def __init__(
        self: FakeContext[UpstreamSpy],
        clock: Clock | None = None,
        *,
        trust: IClusterTrust | None = None,
        tracer: ITracer | None = None,
        **settings: object,
    ) -> None: ...

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        upstream: Any = None,
        trust: IClusterTrust | None = None,
        tracer: ITracer | None = None,
        **settings: object,
    ) -> None:
        self.record = Recorder()
        super().__init__(self.record.hookErrors.append)
        self.clock = clock or Clock()
        self.settings = makeSettings(**settings)
        self.logControl = LogControl(self.settings.logLevel)
        self.stalls = StallWatches(self.clock, self.settings.streamIdleTimeout)
        # Standalone's features (``features.useStandalone``), None as under a broker.
        self.engineQueues: IEngineQueues | None = None  # standalone's
        self.ledger: IRoomLedger | None = None
        self.affinity: Affinity | None = None
        self.engineStates: IEngineStates | None = None
        self.queueing: IQueueing | None = None
        self.residency: IResidency | None = None
        self.loads: ILoadPlanner | None = None
        # The overloads tie ``UpstreamT`` to what is stored here.
        self.upstream = cast(UpstreamT, UpstreamSpy(self.clock) if upstream is None else upstream)
        self.trust = trust
        self.tracer = tracer
        self.sink = ListSink()
        self.reporter = WorkloadReporter(self.sink, self.clock, RUN_ID)
        self.activity = Activity(self.sink)
        self.reservations = ReservationMap()
        self.responses = ResponseTable(self.clock)
        self.exchanges: set[InFlight] = set()
        self.observe(self.record)
        self.observe(TraceObserver())  # feeds an exchange's trace when a test sets ``tracer``

    forwardHeaders = staticmethod(forwardHeaders)

    @property
    def internal(self) -> list[str]:
        """The exception types reported as internal errors."""
        return self.record.internal

    @property
    def errors(self) -> list[tuple[int, str]]:
        """(status, reason) of every generated error answer."""
        return self.record.errors

    def sendError(
        self,
        request: IServerRequest,
        engine: Engine,
        status: int,
        reason: str,
        message: str,
        retryAfter: int | None = None,
    ) -> None:
        self.record.errors.append((status, reason))
        sendError(request, engine, status, reason, message, retryAfter)

    def reportInternal(self, exceptionType: str) -> None:
        self.record.internal.append(exceptionType)


@implementer(IExchangeReport)
@attrs.frozen
class ExchangeReport:
    """What the context's hooks read of an exchange, as a record: hand it to
    ``attemptFailed``, ``committed`` and ``requestEnded`` in place of an ``Exchange``."""

    context: IRequestContext
    engine: Engine
    inference: bool = True
    model: str | None = None
    createdAt: float = 0.0
    committedStatus: int | None = None
    answered: bool = False
    clientGone: bool = False
    written: int = 0
    workload: IWorkload | None = None
    trace: IRequestTrace | None = None
    attempts: int = 0
    stopping: bool = False
    servedBy: str | None = None
    dispatchedAt: float | None = None
    dispatchedWith: int = 0
    ending: BodyEnding | None = None
    prefixKey: AffinityKey | None = None
