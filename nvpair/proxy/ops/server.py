"""The loopback operations listener: ``/metrics``, ``/status``, its history and a live page.

A klein app on its own port, bound to 127.0.0.1 and served through the facades'
``PersonalityFactory`` with ``loopbackOnly``, so a non-loopback peer (or a TLS hello) is
closed without an HTTP answer.  Requests whose ``Host`` is not a loopback name are refused
too (403, by the facades' own rule, ``hostcheck``), so a web page cannot read it through
DNS rebinding.  Everything it shows is read from the service at request time (the 15-minute
history is kept by ``nvpair.proxy.ops.history``, fed once per workload end and attempt outcome);
nothing here runs on the request path.  The page (``nvpair.proxy.ops.page``) loads its script
and style from this listener only.  The listener is a child service of the ``ProxyService``
and stops with it.
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

from klein import Klein
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort
from twisted.logger import Logger
from twisted.web import server
from twisted.web.resource import Resource

from nvpair.proxy.facade.hostcheck import HostGate
from nvpair.proxy.facade.listener import PersonalityFactory
from nvpair.proxy.ops.format import reasonText
from nvpair.proxy.ops.history import Window
from nvpair.proxy.ops.metrics import StateCollector
from nvpair.proxy.ops.nodestate import nodeHealth
from nvpair.proxy.ops.page import renderPage
from nvpair.proxy.routing.affinity import affinityStatus

_WORKLOAD_FIELDS = ("id", "engine", "model", "state", "node", "attempts", "error", "stats")
MAX_MODEL_NAMES = 64
_STATIC = files("nvpair.proxy.ops") / "static"
OPS_JS = (_STATIC / "ops.js").read_bytes()
OPS_CSS = (_STATIC / "ops.css").read_bytes()
# Scripts, styles and data from the listener itself only; no inline script or style.
PAGE_CSP = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    b"connect-src 'self'; base-uri 'none'; form-action 'none'; "
    b"frame-ancestors 'none'"
)


def statusDocument(service: Any) -> dict[str, Any]:
    """The ``/status`` JSON: facades, discovery, scheduler view, last workloads (no content)."""
    reservations = service.reservations
    inFlight = dict(service.activity.inFlight)
    reserved = reservations.byNode()
    now = service.clock.seconds()
    facades: dict[str, Any] = {}
    for engineId, facade in sorted(service.facades.items()):
        nodes = []
        for node in facade.snapshot.nodes:
            nodes.append(
                {
                    "id": node.id,
                    "self": node.isSelf,
                    "models": len(node.models),
                    "modelNames": sorted(node.models)[:MAX_MODEL_NAMES],
                    "addresses": list(node.addresses),
                    "confirmed": facade.confirmed.get(node.id),
                    "inFlight": inFlight.get(node.id, 0),
                    "reserved": reserved.get(node.id, 0),
                    "estimatedLoad": reservations.estimatedLoad(node.id),
                    **nodeHealth(service, engineId, node, now),
                }
            )
        facades[engineId] = {
            "port": facade.port,
            "aliases": list(facade.aliases),
            "pin": facade.pin,
            "localBackend": facade.localBackend,
            "schedulerGeneration": reservations.generation,
            "discoveryUpdates": facade.snapshotCount,
            "nodes": nodes,
        }
    reporter = service.reporter
    recent = [_workload(w) for w in reversed(reporter.recent)]
    listed = list(reservations.order) + sorted(set(reserved) - set(reservations.order))
    return {
        "runId": reporter.runId,
        "now": int(now * 1000),
        "standalone": service.settings.standalone,
        "requestsInProgress": len(service.exchanges),
        "facades": facades,
        "scheduler": {
            "generation": reservations.generation,
            "order": list(reservations.order),
            "estimatedLoad": {n: reservations.estimatedLoad(n) for n in listed},
        },
        "inFlight": inFlight,
        "reservations": reserved,
        "affinity": affinityStatus(service),
        "workloads": {
            "live": reporter.live,
            "terminals": dict(reporter.terminals),
            "recent": recent,
        },
    }


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000)


def _workload(entry: dict[str, Any]) -> dict[str, Any]:
    """One recent workload: its listed fields, times in ms, duration and error in words."""
    out = {k: entry.get(k) for k in _WORKLOAD_FIELDS}
    createdAt, completedAt = entry.get("createdAt"), entry.get("completedAt")
    out["createdAt"] = _ms(createdAt)
    out["completedAt"] = _ms(completedAt)
    out["durationMs"] = None
    if createdAt is not None and completedAt is not None:
        out["durationMs"] = max(0, round((completedAt - createdAt) * 1000))
    out["errorText"] = reasonText(out["error"])
    return out


def historyDocument(service: Any) -> dict[str, Any]:
    """The ``/status/history`` JSON (see ``History.document``) with error reasons in words."""
    doc: dict[str, Any] = service.reporter.history.document()
    codes: set[str] = set()
    for facade in doc["facades"].values():
        codes.update(facade["series"]["errorsByReason"])
        for series in facade["nodes"].values():
            codes.update(series["errorsByReason"])
    doc["reasons"] = {code: reasonText(code) for code in sorted(codes)}
    return doc


def _common(request: Any, contentType: bytes) -> None:
    request.setHeader(b"content-type", contentType)
    request.setHeader(b"cache-control", b"no-store")
    request.setHeader(b"x-content-type-options", b"nosniff")


class OpsApp:
    """The klein app of the operations listener, bound to one service."""

    app = Klein()

    def __init__(self, service: Any) -> None:
        self.service = service
        self.state = CollectorRegistry()
        self.state.register(StateCollector(service))

    @app.route("/", methods=["GET"])
    def page(self, request: Any) -> bytes:
        """The operations page, rendered here; ``/ops.js`` keeps it live from the JSON."""
        _common(request, b"text/html; charset=utf-8")
        request.setHeader(b"content-security-policy", PAGE_CSP)
        html = renderPage(
            statusDocument(self.service), historyDocument(self.service), Window().document(0)
        )
        return html.encode("utf-8")

    @app.route("/ops.js", methods=["GET"])
    def script(self, request: Any) -> bytes:
        """The page's script (served here: the page loads nothing from elsewhere)."""
        _common(request, b"text/javascript; charset=utf-8")
        return OPS_JS

    @app.route("/ops.css", methods=["GET"])
    def style(self, request: Any) -> bytes:
        """The page's style sheet."""
        _common(request, b"text/css; charset=utf-8")
        return OPS_CSS

    @app.route("/status", methods=["GET"])
    def status(self, request: Any) -> bytes:
        """The status document as JSON."""
        _common(request, b"application/json")
        return json.dumps(statusDocument(self.service), separators=(",", ":")).encode()

    @app.route("/status/history", methods=["GET"])
    def history(self, request: Any) -> bytes:
        """The last 15 minutes per facade and node as JSON."""
        _common(request, b"application/json")
        return json.dumps(historyDocument(self.service), separators=(",", ":")).encode()

    @app.route("/metrics", methods=["GET"])
    def metrics(self, request: Any) -> bytes:
        """Prometheus text exposition: event metrics then live-state gauges."""
        _common(request, CONTENT_TYPE_PLAIN_0_0_4.encode())
        return generate_latest(self.service.metrics.registry) + generate_latest(self.state)


class LoopbackHostGuard(Resource):
    """Serves ``inner`` to requests whose ``Host`` is a loopback name; 403 to any other."""

    isLeaf = True

    def __init__(self, inner: Resource, hosts: HostGate) -> None:
        super().__init__()
        self._inner = inner
        self._hosts = hosts

    def render(self, request: Any) -> Any:
        host = request.getHeader(b"host")
        if self._hosts.allows(host):
            return self._inner.render(request)
        self._hosts.refused(host, "ops")
        request.setResponseCode(403)
        _common(request, b"text/plain; charset=utf-8")
        return b"the operations listener answers loopback host names only\n"


def opsResource(service: Any) -> Resource:
    """The root resource of the ops listener for ``service``."""
    return LoopbackHostGuard(OpsApp(service).app.resource(), service.hosts)


class OpsSite(server.Site):
    """The ops listener's site: no access log (scrapes would flood it)."""

    noisy = False

    def log(self, request: Any) -> None:
        """No access log for scrapes."""


def opsFactory(service: Any) -> PersonalityFactory:
    """The loopback-only factory serving the ops app of ``service``."""
    settings = service.settings
    site: Any = OpsSite(opsResource(service), timeout=60, reactor=service.reactor)
    return PersonalityFactory(
        service.clock,
        site,
        None,
        loopbackOnly=True,
        maxConnections=64,
        firstByteTimeout=settings.headerReadTimeout,
    )


class OpsListener(Service):
    """Listens on 127.0.0.1:``port`` while running; a port it cannot bind is logged, not fatal."""

    log = Logger()
    name = "ops"

    def __init__(self, reactor: Any, port: int, factory: PersonalityFactory) -> None:
        self._reactor = reactor
        self.port = port
        self.factory = factory
        self.listening: IListeningPort | None = None

    def startService(self) -> None:
        super().startService()
        try:
            self.listening = self._reactor.listenTCP(self.port, self.factory, interface="127.0.0.1")
        except CannotListenError as e:
            err = e.socketError
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            self.log.warn("ops-bind-failed", port=self.port, reason=reason)
            return
        host: Any = self.listening.getHost()
        self.log.info("ops-listening", port=host.port)

    def stopService(self) -> defer.Deferred[None]:
        super().stopService()
        listening, self.listening = self.listening, None
        if listening is None:
            return defer.succeed(None)
        return defer.maybeDeferred(listening.stopListening).addCallback(lambda _: None)


def startOps(service: Any, port: int) -> OpsListener:
    """Start the operations listener on 127.0.0.1:``port`` as a child of ``service``."""
    listener = OpsListener(service.reactor, port, opsFactory(service))
    listener.setServiceParent(service)
    return listener
