"""The seams that tests fake: the broker sink, the message handler, the upstream connector,
the request context."""

from __future__ import annotations

from typing import Any

from zope.interface import Attribute, Interface


class IBrokerSink(Interface):
    """Where notifications to the broker go (stdout in production, a list in tests)."""

    def notify(method: str, params: dict[str, Any]) -> None:
        """Emit one JSON-RPC notification."""


class IMessageHandler(Interface):
    """What the broker channel calls for every well-formed message."""

    def handle(engine: str | None, name: str, params: dict[str, Any]) -> object:
        """Handle ``name`` (addressed to ``engine`` or unaddressed); return a result or a
        Deferred of one, or raise ``RPCError``."""


class IUpstream(Interface):
    """Opens one HTTP exchange with a node: the seam between dispatch and the network."""

    def request(
        node: Any,
        address: str | None,
        method: bytes,
        path: bytes,
        headers: Any,
        body: bytes,
        connected: Any = None,
    ) -> Any:
        """Return a Deferred firing with an ``IResponse`` from that node; ``connected``, when
        given, is called once the connection is made (the header timer starts there)."""


class IRequestContext(Interface):
    """What every request reports to and draws on while it is handled: the process-wide
    state a front door, an exchange, a peer request and a fleet view share.  The service
    provides one (``RequestContext``); tests use the one fake of the testing kit."""

    settings = Attribute("The process's parsed settings (``options.Settings``).")
    clock = Attribute("The reactor's clock (``IReactorTime``).")
    reservations = Attribute("The reservation map (``routing.reservations.ReservationMap``).")
    activity = Attribute("In-flight dispatch counts per node (``broker.activity.Activity``).")
    reporter = Attribute("Workload events (``broker.workloads.WorkloadReporter``).")
    upstream = Attribute("The connector to nodes (``IUpstream``).")
    trust = Attribute("The cluster trust, or None without a cluster directory.")
    affinity = Attribute("Conversation affinity, or None where it is not ordering.")
    stalls = Attribute("The stream stall watches (``dispatch.stallwatch.StallWatches``).")
    logControl = Attribute("The log level switch (``runtime.logs.LogControl``).")
    exchanges = Attribute("The set of exchanges in flight.")

    def forwardHeaders(incoming: Any) -> Any:
        """The request headers to send upstream for ``incoming``."""

    def sendError(
        request: Any,
        engine: Any,
        status: int,
        reason: str,
        message: str,
        retryAfter: int | None = None,
    ) -> None:
        """Answer ``request`` with a proxy-generated error, counted by reason."""

    def reportInternal(exceptionType: str) -> None:
        """Report an unexpected exception while handling a request (its type name only)."""

    def attemptFailed(exchange: Any, outcome: Any) -> None:
        """An attempt of ``exchange`` ended without committing."""

    def committed(exchange: Any, nodeId: str) -> None:
        """``exchange`` committed its response on ``nodeId``."""

    def requestEnded(exchange: Any) -> None:
        """``exchange`` ended; its terminal bookkeeping has run."""
