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
from collections.abc import Mapping
from importlib.resources import files
from typing import Protocol

from klein import Klein
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort, IReactorTCP
from twisted.logger import Logger
from twisted.web import http, server
from twisted.web.iweb import IRequest
from twisted.web.resource import Resource

from nvpair.proxy.facade.hostcheck import HostGate
from nvpair.proxy.facade.listener import PersonalityFactory
from nvpair.proxy.facade.modelactor import findModelActions
from nvpair.proxy.facade.reload import FleetReloader, findReloader
from nvpair.proxy.ops.documents import (
    FacadeStatus,
    FleetStatus,
    HistoryDocument,
    NodeStatus,
    StatusDocument,
    WorkloadEntry,
)
from nvpair.proxy.ops.format import reasonText
from nvpair.proxy.ops.gauges import StateCollector
from nvpair.proxy.ops.history import Window
from nvpair.proxy.ops.interfaces import IOpsView
from nvpair.proxy.ops.nodestate import nodeHealth
from nvpair.proxy.ops.page import renderPage
from nvpair.proxy.ops.queuegauges import QueueCollector, queueStatus
from nvpair.proxy.ops.residencyview import residencyStatus
from nvpair.proxy.placement.affinity import Affinity

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


def statusDocument(view: IOpsView) -> StatusDocument:
    """The ``/status`` JSON: facades, discovery, scheduler view, last workloads (no content)."""
    reservations = view.context.reservations
    inFlight = dict(view.context.activity.inFlight)
    reserved = reservations.byNode()
    now = view.context.clock.seconds()
    states = view.context.engineStates
    engines = states.status() if states is not None else {}
    facades: dict[str, FacadeStatus] = {}
    reloader = findReloader(view)
    names = reloader.names() if reloader is not None else {}
    for engineId, facade in sorted(view.facades.items()):
        nodes: list[NodeStatus] = []
        for node in facade.snapshot.nodes:
            state, reason, checked = nodeHealth(view, engineId, node, now)
            entry: NodeStatus = {
                "id": node.id,
                "self": node.isSelf,
                "models": len(node.models),
                "modelNames": sorted(node.models)[:MAX_MODEL_NAMES],
                "addresses": list(node.addresses),
                "confirmed": facade.confirmed.get(node.id),
                "inFlight": inFlight.get(node.id, 0),
                "reserved": reserved.get(node.id, 0),
                "estimatedLoad": reservations.estimatedLoad(node.id),
                "state": state.value,
                "stateReason": reason,
                "checkedAt": _ms(checked),
                "name": names.get(node.id),
            }
            if node.id in engines:
                entry["engine"] = engines[node.id]
            nodes.append(entry)
        facades[engineId] = {
            "port": facade.port,
            "aliases": list(facade.aliases),
            "pin": facade.pin,
            "localBackend": facade.localBackend,
            "schedulerGeneration": reservations.generation,
            "discoveryUpdates": facade.snapshotCount,
            "nodes": nodes,
        }
    reporter = view.context.reporter
    recent = [_workload(w) for w in reversed(reporter.recent)]
    listed = list(reservations.order) + sorted(set(reserved) - set(reservations.order))
    document: StatusDocument = {
        "runId": reporter.runId,
        "now": int(now * 1000),
        "standalone": view.settings.standalone,
        "requestsInProgress": len(view.context.exchanges),
        "facades": facades,
        "scheduler": {
            "generation": reservations.generation,
            "order": list(reservations.order),
            "estimatedLoad": {n: reservations.estimatedLoad(n) for n in listed},
        },
        "inFlight": inFlight,
        "reservations": reserved,
        "affinity": affinityStatus(view.context),
        "queueing": queueStatus(view.context.queueing),
        "workloads": {
            "live": reporter.live,
            "terminals": dict(reporter.terminals),
            "recent": recent,
        },
        "fleet": None if reloader is None else fleetStatus(reloader),
    }
    if states is not None:
        document["engineStates"] = engines
        if states.residency is not None:
            document["residency"] = residencyStatus(states.residency, findModelActions(view))
    return document


def fleetStatus(reloader: FleetReloader) -> FleetStatus:
    """The fleet file in force (``/status`` ``fleet``): addresses and names, no secrets."""
    error, spec = reloader.error, reloader.spec
    return {
        "file": reloader.path,
        "generation": reloader.generation,
        "loadedAt": _ms(reloader.loadedAt),
        "engines": list(reloader.serving),
        "keptEngines": [e for e in reloader.serving if spec is None or e not in spec.engines],
        "backends": [
            {
                "engine": b.engine,
                "url": b.url,
                "name": b.name,
                "maxConcurrency": b.maxConcurrency,
                "enabled": b.enabled,
            }
            for b in (spec.backends if spec is not None else ())
        ],
        "clients": [
            {"name": c.name, "weight": c.weight} for c in (spec.clients if spec is not None else ())
        ],
        "error": None
        if error is None
        else {"message": error.message, "line": error.line, "at": int(error.at * 1000)},
        "reloads": {result.value: n for result, n in reloader.results.items()},
    }


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000)


def _seconds(value: object) -> float | None:
    """A recorded time (seconds), or None when absent or not a number."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _workload(entry: Mapping[str, object]) -> WorkloadEntry:
    """One recent workload: only these fields (nothing else its record may hold), times in
    ms, duration and error in words."""
    createdAt, completedAt = _seconds(entry.get("createdAt")), _seconds(entry.get("completedAt"))
    error, stats = entry.get("error"), entry.get("stats")
    error = error if isinstance(error, str) else None
    durationMs = None
    if createdAt is not None and completedAt is not None:
        durationMs = max(0, round((completedAt - createdAt) * 1000))
    return {
        "id": entry.get("id"),
        "engine": entry.get("engine"),
        "model": entry.get("model"),
        "state": entry.get("state"),
        "node": entry.get("node"),
        "attempts": entry.get("attempts"),
        "error": error,
        "stats": stats if isinstance(stats, dict) else None,
        "createdAt": _ms(createdAt),
        "completedAt": _ms(completedAt),
        "durationMs": durationMs,
        "errorText": reasonText(error),
    }


def historyDocument(view: IOpsView) -> HistoryDocument:
    """The ``/status/history`` JSON (see ``History.document``) with error reasons in words."""
    doc = view.context.history.document()
    codes: set[str] = set()
    for facade in doc["facades"].values():
        codes.update(facade["series"]["errorsByReason"])
        for series in facade["nodes"].values():
            codes.update(series["errorsByReason"])
    doc["reasons"] = {code: reasonText(code) for code in sorted(codes)}
    return doc


def _common(request: IRequest, contentType: bytes) -> None:
    request.setHeader(b"content-type", contentType)
    request.setHeader(b"cache-control", b"no-store")
    request.setHeader(b"x-content-type-options", b"nosniff")


class OpsApp:
    """The klein app of the operations listener, bound to one process."""

    app = Klein()

    def __init__(self, view: IOpsView) -> None:
        self.view = view
        self.state = CollectorRegistry()
        self.state.register(StateCollector(view))
        self.state.register(QueueCollector(lambda: view.context.queueing))

    @app.route("/", methods=["GET"])
    def page(self, request: IRequest) -> bytes:
        """The operations page, rendered here; ``/ops.js`` keeps it live from the JSON."""
        _common(request, b"text/html; charset=utf-8")
        request.setHeader(b"content-security-policy", PAGE_CSP)
        html = renderPage(
            statusDocument(self.view), historyDocument(self.view), Window().document(0)
        )
        return html.encode("utf-8")

    @app.route("/ops.js", methods=["GET"])
    def script(self, request: IRequest) -> bytes:
        """The page's script (served here: the page loads nothing from elsewhere)."""
        _common(request, b"text/javascript; charset=utf-8")
        return OPS_JS

    @app.route("/ops.css", methods=["GET"])
    def style(self, request: IRequest) -> bytes:
        """The page's style sheet."""
        _common(request, b"text/css; charset=utf-8")
        return OPS_CSS

    @app.route("/status", methods=["GET"])
    def status(self, request: IRequest) -> bytes:
        """The status document as JSON."""
        _common(request, b"application/json")
        return json.dumps(statusDocument(self.view), separators=(",", ":")).encode()

    @app.route("/status/history", methods=["GET"])
    def history(self, request: IRequest) -> bytes:
        """The last 15 minutes per facade and node as JSON."""
        _common(request, b"application/json")
        return json.dumps(historyDocument(self.view), separators=(",", ":")).encode()

    @app.route("/metrics", methods=["GET"])
    def metrics(self, request: IRequest) -> bytes:
        """Prometheus text exposition: event metrics then live-state gauges."""
        _common(request, CONTENT_TYPE_PLAIN_0_0_4.encode())
        return generate_latest(self.view.metrics.registry) + generate_latest(self.state)


class LoopbackHostGuard(Resource):
    """Serves ``inner`` to requests whose ``Host`` is a loopback name; 403 to any other."""

    isLeaf = True

    def __init__(self, inner: Resource, hosts: HostGate) -> None:
        super().__init__()
        self._inner = inner
        self._hosts = hosts

    def render(self, request: IRequest) -> bytes | int:
        host = request.getHeader(b"host")
        if self._hosts.allows(host):
            rendered: bytes | int = self._inner.render(request)
            return rendered
        self._hosts.refused(host, "ops")
        request.setResponseCode(403)
        _common(request, b"text/plain; charset=utf-8")
        return b"the operations listener answers loopback host names only\n"


def opsResource(view: IOpsView) -> Resource:
    """The root resource of the ops listener for the process ``view``."""
    return LoopbackHostGuard(OpsApp(view).app.resource(), view.hosts)


class OpsSite(server.Site):
    """The ops listener's site: no access log (scrapes would flood it)."""

    noisy = False

    def log(self, request: http.Request) -> None:
        """No access log for scrapes."""


def opsFactory(view: IOpsView) -> PersonalityFactory:
    """The loopback-only factory serving the ops app of the process ``view``."""
    settings = view.settings
    site = OpsSite(opsResource(view), timeout=60, reactor=view.context.clock)
    return PersonalityFactory(
        view.context.clock,
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

    def __init__(self, reactor: IReactorTCP, port: int, factory: PersonalityFactory) -> None:
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
        host = self.listening.getHost()
        port = host.port if isinstance(host, IPv4Address | IPv6Address) else self.port
        self.log.info("ops-listening", port=port)

    def stopService(self) -> defer.Deferred[None]:
        super().stopService()
        listening, self.listening = self.listening, None
        if listening is None:
            return defer.succeed(None)
        return defer.maybeDeferred(listening.stopListening).addCallback(lambda _: None)


def startOps(view: IOpsView, port: int) -> OpsListener:
    """Start the operations listener on 127.0.0.1:``port`` as a child of the process."""
    listener = OpsListener(view.reactor, port, opsFactory(view))
    listener.setServiceParent(view)
    return listener


class _Mode(Protocol):
    @property
    def affinity(self) -> str: ...


class AffinityOwner(Protocol):
    """What ``affinityStatus`` reads of the process (or any view of it): the ``--affinity``
    setting, and the conversation affinity when it orders candidates."""

    @property
    def settings(self) -> _Mode: ...

    @property
    def affinity(self) -> Affinity | None: ...


def affinityStatus(service: AffinityOwner) -> dict[str, object]:
    """The ``affinity`` object of ``/status``: the mode, whether it orders, and its table."""
    affinity = service.affinity
    document: dict[str, object] = {
        "mode": service.settings.affinity,
        "active": affinity is not None,
    }
    if affinity is not None:
        document.update(affinity.status())
    return document
