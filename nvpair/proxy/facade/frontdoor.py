"""Where a facade's requests enter: the ``Host`` rule, admission, then the route's policy.

Every plaintext request of the facade, on its primary port or an alias, comes here first:
one whose ``Host`` is not a loopback name gets 403 ``host_denied`` before anything else
(protocol §8; ``hostcheck``), so it reaches no admission, no node and no workload.

Preflights and fleet model lists go to ``fleet``; inference, model-routed and everything
else become an ``Exchange`` run by its route class's placement policy.  An unexpected
exception answers 500 ``internal`` and is reported, without touching any other request.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.logger import Logger
from zope.interface import implementer

from nvpair.proxy.dispatch.exchange import Exchange
from nvpair.proxy.engines import RouteClass
from nvpair.proxy.facade.facade import Facade
from nvpair.proxy.facade.fleet import IFleetViews
from nvpair.proxy.facade.hostcheck import HostGate
from nvpair.proxy.http.interfaces import IDoor, IServerRequest
from nvpair.proxy.interfaces import IRequestContext
from nvpair.proxy.placement.interfaces import IFleetView
from nvpair.proxy.placement.keys import AffinityKey, keyFor, scopeOf
from nvpair.proxy.routing.admission import Refused, admit
from nvpair.proxy.routing.cors import isPreflight

HOST_DENIED = (
    "the Host header does not name this machine (DNS rebinding protection); "
    "the proxy's --allowed-hosts option can allow another name"
)


@implementer(IDoor)
class FrontDoor:
    """Admits one facade's requests and starts the right policy for each."""

    log = Logger()

    def __init__(
        self, context: IRequestContext, facade: Facade, fleet: IFleetViews, hosts: HostGate
    ) -> None:
        self.context = context
        self.facade = facade
        self.engine = facade.engine
        self.fleet = fleet
        self.hosts = hosts
        self.allows = hosts.allows

    def handle(self, request: IServerRequest) -> None:
        """Route one request (called from the site's render)."""
        engine = self.engine
        host = request.getHeader(b"host")
        if not self.allows(host):
            self.hosts.refused(host, engine.id)
            if request.tooLarge:
                request.setHeader(b"connection", b"close")
            self.context.sendError(request, engine, 403, "host_denied", HOST_DENIED)
            return
        if request.tooLarge:
            request.setHeader(b"connection", b"close")
            self.context.sendError(
                request,
                engine,
                413,
                "body_too_large",
                "the request body is larger than the proxy accepts",
            )
            return
        method = request.method
        if method == b"OPTIONS" and isPreflight(
            method, _lowerHeaders(request, (b"origin", b"access-control-request-method"))
        ):
            self.fleet.preflight(self.facade, request)
            return
        body = request.content.getvalue() if request.content is not None else b""
        keyer = promptKeyer(self.context, self.facade, request)
        decision = admit(engine, method, request.path, body, keyer)
        if isinstance(decision, Refused):
            self.context.sendError(
                request, engine, decision.status, decision.reason, decision.message
            )
            return
        if decision.routeClass is RouteClass.FLEET_LIST:
            self.fleet.modelList(self.facade, request)
            return
        Exchange(
            self.context,
            self.facade,
            request,
            decision.routeClass,
            decision.model,
            body,
            decision.facts,
            decision.prefixKey,
        ).start()

    def crashed(self, request: IServerRequest, error: Exception) -> None:
        """An unexpected exception escaped admission: 500, report, keep serving."""
        self.log.failure("request-crashed", engine=self.engine.id)
        self.context.reportInternal(type(error).__name__)
        if not request.finished and not request.startedWriting:
            try:
                self.context.sendError(
                    request, self.engine, 500, "internal", "internal proxy error"
                )
            except Exception:
                self.log.failure("error-answer-failed", engine=self.engine.id)


def promptKeyer(
    context: IRequestContext, facade: IFleetView, request: IServerRequest
) -> Callable[[str, dict[str, object]], AffinityKey | None] | None:
    """What takes a request's prompt digests at admission (``keys.keyFor`` in the request's
    scope), where placement will read them: standalone with affinity on, in a fleet of
    several nodes (one has no choice to make, and that common setup pays nothing)."""
    affinity = context.affinity
    if affinity is None or len(facade.snapshot) < 2:
        return None
    engineId, path = facade.engine.id, request.path

    def keyer(model: str, document: dict[str, object]) -> AffinityKey | None:
        authorization = request.getHeader(b"authorization")
        scope = scopeOf(authorization, affinity.sharesPrefixes())
        return keyFor(engineId, model, path, document, scope, sessionOf(request))

    return keyer


# Agent CLIs' session headers, read from their public sources (research notes): Claude
# Code's, Codex's (newer and older spellings), OpenCode's.  Only an affinity hint.
SESSION_HEADERS = (
    b"x-claude-code-session-id",
    b"session-id",
    b"session_id",
    b"x-session-affinity",
    b"x-session-id",
)


def sessionOf(request: IServerRequest) -> bytes | None:
    """The first agent session header the request carries, if any."""
    for name in SESSION_HEADERS:
        value = request.getHeader(name)
        if value:
            return value
    return None


def _lowerHeaders(request: IServerRequest, names: tuple[bytes, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in names:
        value = request.getHeader(name)
        if value is not None:
            out[name.decode()] = value.decode("latin-1")
    return out
