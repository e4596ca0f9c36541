"""The loopback operations listener: ``/metrics``, ``/status`` and a small status page.

A klein app on its own port, bound to 127.0.0.1 and served through the facades'
``PersonalityFactory`` with ``loopbackOnly``, so a non-loopback peer (or a TLS hello) is
closed without an HTTP answer.  Requests whose ``Host`` is not a loopback name are refused
too (403, by the facades' own rule, ``hostcheck``), so a web page cannot read it through
DNS rebinding.  Everything it shows is read from the service at request time; nothing here
runs on the request path.  The listener is a child service of the ``ProxyService`` and
stops with it.
"""

from __future__ import annotations

import json
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

from nvpair.proxy.affinity import affinityStatus
from nvpair.proxy.hostcheck import HostGate
from nvpair.proxy.listener import PersonalityFactory
from nvpair.proxy.metrics import StateCollector

_WORKLOAD_FIELDS = ("id", "engine", "model", "state", "node", "attempts", "error", "stats")


def statusDocument(service: Any) -> dict[str, Any]:
    """The ``/status`` JSON: facades, discovery, scheduler view, last workloads (no content)."""
    reservations = service.reservations
    inFlight = dict(service.activity.inFlight)
    reserved = reservations.byNode()
    facades: dict[str, Any] = {}
    for engineId, facade in sorted(service.facades.items()):
        nodes = []
        for node in facade.snapshot.nodes:
            nodes.append({
                "id": node.id,
                "self": node.isSelf,
                "models": len(node.models),
                "addresses": list(node.addresses),
                "confirmed": facade.confirmed.get(node.id),
                "inFlight": inFlight.get(node.id, 0),
                "reserved": reserved.get(node.id, 0),
                "estimatedLoad": reservations.estimatedLoad(node.id),
            })
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
    recent = [{k: w.get(k) for k in _WORKLOAD_FIELDS} for w in reversed(reporter.recent)]
    listed = list(reservations.order) + sorted(set(reserved) - set(reservations.order))
    return {
        "runId": reporter.runId,
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
        """The human status page (renders ``/status`` in the browser)."""
        _common(request, b"text/html; charset=utf-8")
        request.setHeader(b"content-security-policy", _PAGE_CSP)
        return STATUS_PAGE

    @app.route("/status", methods=["GET"])
    def status(self, request: Any) -> bytes:
        """The status document as JSON."""
        _common(request, b"application/json")
        return json.dumps(statusDocument(self.service), separators=(",", ":")).encode()

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
        service.clock, site, None, loopbackOnly=True, maxConnections=64,
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
            self.listening = self._reactor.listenTCP(self.port, self.factory,
                                                     interface="127.0.0.1")
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


_PAGE_CSP = (b"default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
             b"connect-src 'self'")

STATUS_PAGE = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>nvpair-proxy</title>
<style>
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.4em 0 1.2em}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}
th{background:#f3f3f3}.muted{color:#777}
</style></head><body>
<h1>nvpair-proxy</h1>
<p class="muted" id="head">loading /status&hellip;</p>
<div id="facades"></div>
<h2>Recent workloads</h2><div id="workloads"></div>
<p class="muted"><a href="/status">/status</a> &middot; <a href="/metrics">/metrics</a></p>
<script>
function el(tag, text){
  var e=document.createElement(tag);if(text!==undefined)e.textContent=text;return e;}
function table(cols, rows){
  var t=el("table"),h=el("tr");
  cols.forEach(function(c){h.appendChild(el("th",c));});t.appendChild(h);
  rows.forEach(function(r){var tr=el("tr");r.forEach(function(v){
    var text=v===null||v===undefined?"":(typeof v==="object"?JSON.stringify(v):String(v));
    tr.appendChild(el("td",text));});
    t.appendChild(tr);});
  return t;}
function render(s){
  document.getElementById("head").textContent="run "+s.runId+(s.standalone?" (standalone)":"")+
    " \\u00b7 in progress "+s.requestsInProgress+" \\u00b7 live workloads "+s.workloads.live+
    " \\u00b7 scheduler generation "+s.scheduler.generation;
  var f=document.getElementById("facades");f.replaceChildren();
  Object.keys(s.facades).forEach(function(id){var fa=s.facades[id];
    var ports=fa.port+(fa.aliases.length?" + "+fa.aliases.join(", "):"");
    f.appendChild(el("h2",id+" \\u2014 port "+ports));
    f.appendChild(el("p","pin: "+(fa.pin||"none")+
      " \\u00b7 local backend: "+(fa.localBackend||"none")+
      " \\u00b7 discovery updates: "+fa.discoveryUpdates));
    f.appendChild(table(
      ["node","self","models","addresses","confirmed","in flight","reserved","est. load"],
      fa.nodes.map(function(n){return [n.id,n.self,n.models,n.addresses.join(" "),n.confirmed,
        n.inFlight,n.reserved,n.estimatedLoad];})));});
  var w=document.getElementById("workloads");w.replaceChildren();
  w.appendChild(table(["id","engine","model","state","node","attempts","error","stats"],
    s.workloads.recent.map(function(x){
      return [x.id,x.engine,x.model,x.state,x.node,x.attempts,x.error,x.stats];})));}
function refresh(){
  fetch("/status",{cache:"no-store"}).then(function(r){return r.json();}).then(render)
  .catch(function(e){document.getElementById("head").textContent="cannot read /status: "+e;});}
refresh();setInterval(refresh,2000);
</script></body></html>
"""
