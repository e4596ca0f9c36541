"""What the parts of one exchange need from each other and from the facade, as interfaces:
an attempt types its exchange with ``IAttemptExchange`` (which ``Exchange`` provides) rather
than importing it, and the body protocol its attempt with ``IBodyGate``.  The client's
request is ``http.interfaces.IServerRequest``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zope.interface import Attribute, Interface

from nvpair.proxy.interfaces import IExchangeReport
from nvpair.proxy.placement.interfaces import IFleetView, IPlacementExchange

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred
    from twisted.internet.interfaces import IPushProducer, IReactorTime
    from twisted.python.failure import Failure
    from twisted.web.http_headers import Headers

    from nvpair.proxy.dispatch.outcome import Committed, Failed
    from nvpair.proxy.endings import BodyEnding
    from nvpair.proxy.engines import Engine, RouteClass
    from nvpair.proxy.interfaces import IRequestContext, IUpstream, IWorkload
    from nvpair.proxy.routing.facts import RequestFacts
    from nvpair.proxy.settings import Settings
    from nvpair.proxy.tracing.interfaces import IRequestTrace


class IDiscoveryWatcher(Interface):
    """Told when a node it watches leaves discovery."""

    def left() -> None:
        """The watched node left discovery."""


class IFacadeView(IFleetView):
    """What dispatch uses of a facade: placement's view, and how its nodes are reached."""

    localBackend: str | None = Attribute("Where this node's own engine listens, if known.")
    confirmed: dict[str, str] = Attribute("Node id to the address that last connected.")

    def watch(nodeId: str, watcher: IDiscoveryWatcher) -> None:
        """Call ``watcher.left()`` if ``nodeId`` leaves discovery (until ``unwatch``)."""

    def unwatch(nodeId: str, watcher: IDiscoveryWatcher) -> None:
        """Stop watching ``nodeId`` for ``watcher``."""

    def nextSnapshot() -> Deferred[None]:
        """Fires when discovery next changes."""


class IAttemptExchange(IExchangeReport):
    """What an attempt, and the stall watch of its stream, need from the exchange they run for:
    the request to send, where to send it, and where its answer goes."""

    context: IRequestContext = Attribute("The process's request context.")
    facade: IFacadeView = Attribute("The facade the request arrived on.")
    engine: Engine = Attribute("The facade's engine.")
    settings: Settings = Attribute("The process's settings (the header cap).")
    clock: IReactorTime = Attribute("The reactor's clock.")
    upstream: IUpstream = Attribute("The connector to nodes.")
    method: bytes = Attribute("The request method.")
    uri: bytes = Attribute("The request target (path and query).")
    forwardHeaders: Headers = Attribute("The request headers to send upstream.")
    body: bytes = Attribute("The request body.")
    facts: RequestFacts = Attribute("What the body says that routing acts on (``stream``).")
    routeClass: RouteClass = Attribute(
        "The request's route class (404 is retried unless it is verbatim)."
    )
    workload: IWorkload | None = Attribute("The request's workload, if it is one.")
    written: int = Attribute("Body bytes relayed to the client so far.")
    trace: IRequestTrace | None = Attribute("The request's spans, or None (``--otel`` off).")

    def writeHead(
        committed: Committed,
        phrase: bytes,
        headers: Headers,
        length: int | None,
        upstream: IPushProducer,
    ) -> None:
        """Commit: send the status and headers, with ``upstream`` as the body's producer."""

    def write(data: bytes) -> None:
        """Relay one chunk of the committed body."""

    def endBody(clean: bool) -> BodyEnding:
        """The committed body ended, cleanly or not: finish or cut the client's response."""

    def bodyEnded(committed: Committed) -> None:
        """The committed body ended (``committed.ending`` says how)."""

    def attemptFailed(outcome: Failed) -> None:
        """The attempt ended uncommitted (just before its Deferred fires)."""


class IPolicyOwner(IPlacementExchange):
    """What a placement loop's driver (``driver.PolicyDriver``) needs of the exchange it
    places: the policy's view of it, and where the loop's end goes."""

    halted: bool = Attribute(
        "Whether a wait is cancelled as soon as it is yielded: the client left or the "
        "process is stopping (the cancellation found nothing to cancel while the policy ran "
        "between two waits)."
    )

    def placed() -> None:
        """The policy ended: an attempt committed, or it answered the request itself."""

    def interrupted(error: BaseException | None) -> None:
        """The loop ended without placing: the policy or a wait raised ``error`` (report it
        and answer for it), or a wait was cancelled (None); end the request."""


class IBodyGate(Interface):
    """What the body protocol of an attempt (``relay.Relay``) reports to it: the gate that
    holds a response until its first body byte commits it."""

    exchange: IAttemptExchange = Attribute("Where committed body bytes go.")

    def headersArrived() -> None:
        """The body protocol is connected: the response's headers are in."""

    def commit() -> bool:
        """Claim the attempt for commit; False when it was abandoned first."""

    def bodyLost(reason: Failure) -> None:
        """The body ended (``reason`` says whether cleanly)."""
