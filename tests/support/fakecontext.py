"""The one fake request context of the unit tests (``IRequestContext``).

Real reservations, activity, workloads and stall watches over a ``ListSink`` and a
``Clock``; the settings are the protocol defaults overridden by keyword; the upstream is a
``FakeUpstream`` unless a test brings its own; every report (internal errors, generated
errors, failed attempts, commits, ends) is recorded in ``record``; with a ``tracer`` the
hooks feed an exchange's trace as ``context.RequestContext`` does.
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
from nvpair.proxy.engines import Engine
from nvpair.proxy.http.interfaces import IServerRequest
from nvpair.proxy.http.site import sendError
from nvpair.proxy.interfaces import InFlight, IRequestContext
from nvpair.proxy.routing.affinity import Affinity
from nvpair.proxy.routing.reservations import ReservationMap
from nvpair.proxy.runtime.logs import LogControl
from tests.support.fakeupstream import RUN_ID, FakeUpstream, ListSink, makeSettings

UpstreamT = TypeVar("UpstreamT")


@attrs.define
class Recorder:
    """The context's reporting hooks, recorded."""

    internal: list[str] = attrs.Factory(list)
    errors: list[tuple[int, str]] = attrs.Factory(list)
    failedAttempts: list[Any] = attrs.Factory(list)
    commits: list[str] = attrs.Factory(list)
    ended: list[Any] = attrs.Factory(list)
    stalled: list[str] = attrs.Factory(list)


@implementer(IRequestContext)
class FakeContext(Generic[UpstreamT]):
    """What a request draws on and reports to (``RequestContext`` in production).

    ``FakeContext(**settings)`` has a ``FakeUpstream``; ``FakeContext(upstream=...)`` the
    test's own (typed as given).  ``logLevel`` (a setting) also sets ``logControl``.
    """

    # This one first: the other's ``**settings`` would take ``upstream`` for a setting.
    @overload
    def __init__(
        self,
        clock: Clock | None = None,
        *,
        upstream: UpstreamT,
        trust: Any = None,
        tracer: Any = None,
        **settings: object,
    ) -> None: ...

    @overload
    def __init__(
        self: FakeContext[FakeUpstream],
        clock: Clock | None = None,
        *,
        trust: Any = None,
        tracer: Any = None,
        **settings: object,
    ) -> None: ...

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        upstream: Any = None,
        trust: Any = None,
        tracer: Any = None,
        **settings: object,
    ) -> None:
        self.clock = clock or Clock()
        self.settings = makeSettings(**settings)
        self.logControl = LogControl(self.settings.logLevel)
        self.stalls = StallWatches(self.clock, self.settings.streamIdleTimeout)
        self.affinity: Affinity | None = None
        # The overloads tie ``UpstreamT`` to what is stored here.
        self.upstream = cast(UpstreamT, FakeUpstream(self.clock) if upstream is None else upstream)
        self.trust = trust
        self.tracer = tracer
        self.sink = ListSink()
        self.reporter = WorkloadReporter(self.sink, self.clock, RUN_ID)
        self.activity = Activity(self.sink)
        self.reservations = ReservationMap()
        self.exchanges: set[InFlight] = set()
        self.record = Recorder()

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

    def attemptFailed(self, exchange: Any, outcome: Any) -> None:
        self.record.failedAttempts.append(outcome)
        if exchange.trace is not None:
            exchange.trace.attemptFailed(outcome)

    def committed(self, exchange: Any, nodeId: str) -> None:
        self.record.commits.append(nodeId)
        if exchange.trace is not None:
            exchange.trace.committed(nodeId, self.clock.seconds() - exchange.createdAt)

    def requestEnded(self, exchange: Any) -> None:
        self.record.ended.append(exchange)
        if exchange.trace is not None:
            exchange.trace.ended(exchange)

    def streamStalled(self, engineId: str) -> None:
        self.record.stalled.append(engineId)
