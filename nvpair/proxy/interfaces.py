"""The seams that tests fake: the broker sink, the message handler, the upstream connector,
the request context.

This module sits below every package that uses these seams (broker, dispatch, routing,
facade, cluster), so it imports from none of them: an attribute whose class lives there is
an ``Attribute`` that names the class in its description instead of a type.  It may import
the leaf modules (``settings``, ``engines``, ``runtime.logs``, ``tracing.interfaces``) and
``http.request``, none of which imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from zope.interface import Attribute, Interface

from nvpair.proxy.engines import Engine
from nvpair.proxy.http.interfaces import IServerRequest
from nvpair.proxy.runtime.logs import LogControl
from nvpair.proxy.settings import Settings
from nvpair.proxy.tracing.interfaces import ITracer


class IBrokerSink(Interface):
    """Where notifications to the broker go (stdout in production, a list in tests)."""

    listening: bool = Attribute(
        "Whether anything receives notifications (not in standalone mode): when not, "
        "producers may skip building what would be sent."
    )

    def notify(method: str, params: dict[str, object]) -> None:
        """Emit one JSON-RPC notification."""


class IMessageHandler(Interface):
    """What the broker channel calls for every well-formed message."""

    def handle(engine: str | None, name: str, params: dict[str, object]) -> object:
        """Handle ``name`` (addressed to ``engine`` or unaddressed); return a result or a
        Deferred of one, or raise ``RPCError``."""


class IUpstream(Interface):
    """Opens one HTTP exchange with a node: the seam between dispatch and the network."""

    def request(
        node: Any,
        address: str | None,
        method: bytes,
        path: bytes,
        headers: Headers,
        body: bytes,
        connected: Callable[[], None] | None = None,
    ) -> defer.Deferred[IResponse]:
        """Return a Deferred firing with an ``IResponse`` from ``node`` (a
        ``routing.candidates.Node``); ``connected``, when given, is called once the
        connection is made (the header timer starts there)."""


class InFlight(Protocol):
    """Something handling a request that the process cuts off when it stops: an exchange, a
    peer forward, a fleet view.  Structural, so that each package's class qualifies as it is."""

    def shutdown(self) -> None: ...


class IRequestContext(Interface):
    """What every request reports to and draws on while it is handled: the process-wide
    state a front door, an exchange, a peer request and a fleet view share.  The process
    provides one (``context.RequestContext``); unit tests use ``tests.support.fakecontext``."""

    settings: Settings = Attribute("The process's validated settings.")
    clock: IReactorTime = Attribute("The reactor's clock.")
    upstream: IUpstream = Attribute("The connector to nodes.")
    logControl: LogControl = Attribute("The log level switch (skip debug-only work).")
    exchanges: set[InFlight] = Attribute("Everything handling a request now.")
    reservations = Attribute("The reservation map (``routing.reservations.ReservationMap``).")
    activity = Attribute("In-flight dispatch counts per node (``broker.activity.Activity``).")
    reporter = Attribute("Workload events (``broker.workloads.WorkloadReporter``).")
    trust = Attribute(
        "The cluster trust (``cluster.membership.ClusterTrust``), or None without a "
        "cluster directory."
    )
    affinity = Attribute(
        "Conversation affinity (``routing.affinity.Affinity``), or None where it is not "
        "ordering candidates (under a broker, or ``--affinity off``)."
    )
    stalls = Attribute("The stream stall watches (``dispatch.stallwatch.StallWatches``).")
    tracer: ITracer | None = Attribute(
        "Starts request traces (``tracing.spans.Tracer``), or None with ``--otel`` off."
    )

    def forwardHeaders(incoming: Headers) -> Headers:
        """The request headers to send upstream for ``incoming``."""

    def sendError(
        request: IServerRequest,
        engine: Engine,
        status: int,
        reason: str,
        message: str,
        retryAfter: int | None = None,
    ) -> None:
        """Answer ``request`` with a proxy-generated error, counted by reason."""

    def reportInternal(exceptionType: str) -> None:
        """Report an unexpected exception while handling a request (its type name only)."""

    def attemptFailed(exchange: Any, outcome: Any) -> None:
        """An attempt of ``exchange`` (a ``dispatch.exchange.Exchange``) ended without
        committing; ``outcome`` is its ``dispatch.attempt.Failed``."""

    def committed(exchange: Any, nodeId: str) -> None:
        """``exchange`` committed its response on ``nodeId``."""

    def requestEnded(exchange: Any) -> None:
        """``exchange`` ended; its terminal bookkeeping has run."""

    def streamStalled(engineId: str) -> None:
        """A committed stream of ``engineId`` was cut: its engine went silent too long."""
