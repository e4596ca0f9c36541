"""The seams that tests fake: the broker sink, the message handler, the upstream connector,
the request context, and what the request context's hooks read of an exchange.

This module sits below every package that uses these seams (broker, dispatch, facade,
cluster), so it imports from none of them: what it needs of their classes is an interface
declared here (``IExchangeReport``, ``IWorkload``, ``IStallWatches``, ``IPeerTrust``...),
which those classes declare with ``@implementer``.  It imports only leaves: ``settings``,
``engines``, ``http.interfaces``, ``tracing.interfaces`` and the routing interfaces and
values (``routing`` in turn declares what it needs of the context as ``IPlacementContext``
and never imports this module).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from twisted.internet import defer
from twisted.internet.interfaces import (
    IOpenSSLClientConnectionCreator,
    IPushProducer,
    IReactorTCP,
    IReactorTime,
)
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from zope.interface import Attribute, Interface

from nvpair.proxy.endings import BodyEnding, FailureKind
from nvpair.proxy.engines import Engine
from nvpair.proxy.flow.interfaces import IEngineQueues, IQueueing
from nvpair.proxy.http.interfaces import IServerRequest
from nvpair.proxy.logswitch import ILogControl
from nvpair.proxy.nodestate.interfaces import IEngineStates, IRoomLedger
from nvpair.proxy.placement.interfaces import IPlacementContext
from nvpair.proxy.settings import Settings
from nvpair.proxy.tracing.interfaces import IRequestTrace, ITracer

if TYPE_CHECKING:
    from nvpair.proxy.placement.keys import AffinityKey
    from nvpair.proxy.routing.nodes import Node


class IConnectingReactor(IReactorTCP, IReactorTime):
    """What the connector to nodes needs of the reactor: TCP dials and the clock of their
    timeouts (as Twisted's ``IDistTrialReactor`` combines the interfaces it needs)."""


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
        node: Node | None,
        address: str | None,
        method: bytes,
        path: bytes,
        headers: Headers,
        body: bytes,
        connected: Callable[[], None] | None = None,
    ) -> defer.Deferred[IResponse]:
        """Return a Deferred firing with an ``IResponse`` from ``address`` of ``node``;
        ``connected``, when given, is called once the connection is made (the header timer
        starts there)."""


class IPeerTrust(Interface):
    """What the peer door asks of the cluster trust (``ClusterTrust``) on every request."""

    def peerNodeId(transport: object) -> str | None:
        """The pinned node id behind a TLS connection's peer certificate, or None."""

    def presentsCurrentIdentity(transport: object) -> bool:
        """Whether the connection was made with this node's current certificate."""


class IClusterTrust(IPeerTrust):
    """The cluster trust as the connector to peers and the peer door use it
    (``cluster.membership.ClusterTrust``)."""

    nodeId: str | None = Attribute("This node's id, or None when not a member.")
    fingerprint: str | None = Attribute("This node's certificate fingerprint, if any.")

    def pinFor(nodeId: str) -> str | None:
        """The pinned (lowercase) fingerprint of ``nodeId``, or None."""

    def clientCreatorFor(nodeId: str) -> IOpenSSLClientConnectionCreator:
        """The TLS client side of a connection to peer ``nodeId`` (raises ``ClusterError``
        when this node cannot reach peers now)."""


class IWorkload(Interface):
    """One request's workload events, as the exchange reports them
    (``broker.workloads.Workload``)."""

    id: str = Attribute("The workload id.")
    ended: bool = Attribute("Whether its terminal event was emitted.")
    stats: dict[str, object] | None = Attribute(
        "The statistics of its terminal event (None before it, or when nothing was measured)."
    )

    def submitted(scheduledOn: str | None) -> None:
        """Queued again (``None``) or placed on ``scheduledOn``."""

    def started(nodeId: str) -> None:
        """``nodeId`` started answering it."""

    def finish(
        state: str, error: str | None = None, stats: dict[str, object] | None = None
    ) -> bool:
        """Emit the terminal event once; later calls do nothing and return False."""


class IWorkloadReporter(Interface):
    """Where workloads are admitted (``broker.workloads.WorkloadReporter``)."""

    def admit(engine: str, model: str) -> IWorkload:
        """A new workload of ``model`` on ``engine``, reported queued."""


class IActivity(Interface):
    """In-flight dispatch counts per node (``broker.activity.Activity``)."""

    inFlight: dict[str, int] = Attribute("Dispatches in flight per node id (absent: none).")
    listener: Callable[[str, int, str | None], None] | None = Attribute(
        "Called ``listener(nodeId, delta, model)`` after each change (standalone's room "
        "ledger and residency view), or None."
    )

    def change(nodeId: str, delta: int, model: str | None = None) -> None:
        """Add ``delta`` to the in-flight count of ``nodeId`` (a dispatch for ``model``)."""


class IExchangeReport(Interface):
    """What the request context's observers (metrics, history, traces, logs, standalone's
    queue and cache accounting) and a stream's stall watch read of an exchange
    (``dispatch.exchange.Exchange``).  Read only: nothing outside the exchange writes it."""

    context: IRequestContext = Attribute("The process's request context.")
    engine: Engine = Attribute("The facade's engine.")
    inference: bool = Attribute("Whether this is an inference request.")
    model: str | None = Attribute("The normalized model the request names, if any.")
    createdAt: float = Attribute("When the request was admitted (clock seconds).")
    committedStatus: int | None = Attribute("The committed response's status, once one is.")
    answered: bool = Attribute("Whether the client was given an answer (committed or not).")
    clientGone: bool = Attribute("Whether the client left before its answer ended.")
    written: int = Attribute("Body bytes relayed to the client so far.")
    workload: IWorkload | None = Attribute("The request's workload, if it is one.")
    trace: IRequestTrace | None = Attribute("The request's spans, or None (``--otel`` off).")
    attempts: int = Attribute("Dispatches made so far.")
    stopping: bool = Attribute("Whether the process is stopping (the request is cancelled).")
    servedBy: str | None = Attribute(
        "The node whose response committed; before a commit, the node of the attempt in "
        "flight; None when there is neither."
    )
    dispatchedAt: float | None = Attribute("When the latest attempt was dispatched.")
    dispatchedWith: int = Attribute(
        "How many of ours ran on the latest attempt's node when it was dispatched, itself "
        "included: for its model (standalone, where engines' slots may be per model), else "
        "for any."
    )
    ending: BodyEnding | None = Attribute("How the committed body ended, once it did.")
    prefixKey: AffinityKey | None = Attribute(
        "The prompt digests placement committed with (standalone placement by cache)."
    )


class IAttemptReport(Interface):
    """What the hooks read of an attempt that ended uncommitted (``dispatch.outcome.Failed``)."""

    node: Node = Attribute("The node the attempt went to.")
    kind: FailureKind = Attribute("Why it ended.")
    status: int | None = Attribute("The retryable status it got, if it got one.")
    retryAfter: float | None = Attribute("The engine's ``Retry-After`` with it, in seconds.")


class IRequestObserver(Interface):
    """An observer of every request's outcomes, to which the request context's hooks fan out
    (``hooks.ObservedContext``; ``hooks.RequestObserver`` does nothing for each)."""

    def attemptFailed(exchange: IExchangeReport, outcome: IAttemptReport) -> None:
        """An attempt of ``exchange`` ended without committing, as ``outcome`` says."""

    def committed(exchange: IExchangeReport, nodeId: str, firstByte: float) -> None:
        """``exchange`` committed on ``nodeId``, ``firstByte`` seconds after admission."""

    def requestEnded(exchange: IExchangeReport) -> None:
        """``exchange`` ended; its terminal bookkeeping has run."""

    def streamStalled(engineId: str) -> None:
        """A committed stream of ``engineId`` was cut: its engine went silent too long."""


class IStallWatch(IPushProducer):
    """The idle watch of one committed stream: the producer the client's flow control drives
    (``dispatch.stallwatch.StallWatch``)."""

    def start() -> None:
        """Start watching (once the response is committed)."""

    def stop() -> None:
        """Stop watching (the body ended)."""


class IStallWatches(Interface):
    """The process's stream idle watches (``dispatch.stallwatch.StallWatches``)."""

    def watch(
        upstream: IPushProducer, exchange: IExchangeReport, nodeId: str
    ) -> IStallWatch | None:
        """A watch for one committed body (not yet started), or None when the timeout is 0."""


class InFlight(Protocol):
    """Something handling a request that the process cuts off when it stops: an exchange, a
    peer forward, a fleet view.  Structural, so that each package's class qualifies as it is."""

    def shutdown(self) -> None: ...


class IRequestContext(IPlacementContext):
    """What every request reports to and draws on while it is handled: the process-wide
    state a front door, an exchange, a peer request and a fleet view share.  The process
    provides one (``context.RequestContext``); unit tests use ``testing.fakecontext``."""

    settings: Settings = Attribute("The process's validated settings.")
    clock: IReactorTime = Attribute("The reactor's clock.")
    upstream: IUpstream = Attribute("The connector to nodes.")
    logControl: ILogControl = Attribute("The log level switch (skip debug-only work).")
    exchanges: set[InFlight] = Attribute("Everything handling a request now.")
    activity: IActivity = Attribute("In-flight dispatch counts per node.")
    reporter: IWorkloadReporter = Attribute("Workload events.")
    trust: IClusterTrust | None = Attribute(
        "The cluster trust, or None without a cluster directory."
    )
    stalls: IStallWatches = Attribute("The stream stall watches.")
    engineQueues: IEngineQueues | None = Attribute(
        "The watch over first attempts waiting in an engine's queue (standalone), or None."
    )
    ledger: IRoomLedger | None = Attribute(
        "The room ledger (``nodestate.ledger.RoomLedger``) in standalone mode, else None."
    )
    engineStates: IEngineStates | None = Attribute(
        "The engines' own state (``nodestate.states.EngineStates``) in standalone mode, "
        "else None (under a broker)."
    )
    queueing: IQueueing | None = Attribute(
        "Standalone flow control (the fair queue and the node breakers), or None under a broker."
    )
    tracer: ITracer | None = Attribute(
        "Starts request traces (``tracing.spans.Tracer``), or None with ``--otel`` off."
    )

    def observe(observer: IRequestObserver) -> None:
        """Add ``observer`` to those the hooks below fan out to (``hooks.ObservedContext``)."""

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

    def attemptFailed(exchange: IExchangeReport, outcome: IAttemptReport) -> None:
        """An attempt of ``exchange`` ended without committing, as ``outcome`` says."""

    def committed(exchange: IExchangeReport, nodeId: str) -> None:
        """``exchange`` committed its response on ``nodeId``."""

    def requestEnded(exchange: IExchangeReport) -> None:
        """``exchange`` ended; its terminal bookkeeping has run."""

    def streamStalled(engineId: str) -> None:
        """A committed stream of ``engineId`` was cut: its engine went silent too long."""
