"""The process: a ``MultiService`` of facades sharing one reservation map, pool and broker link.

``ProxyService`` handles every broker message (protocol §4), owns the process-wide state
(reservations, workloads, in-flight counts, the upstream pool) and is the context every
request's ``Exchange`` reports to.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import IO, Any

from twisted.application.service import MultiService
from twisted.internet import defer
from twisted.internet.interfaces import IProtocol
from twisted.logger import ILogObserver, Logger
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.components import Componentized
from zope.interface import implementer

from nvpair.proxy.broker import jsonrpc
from nvpair.proxy.broker.activity import Activity
from nvpair.proxy.broker.channel import BrokerChannel, NullSink, Reply, RPCError
from nvpair.proxy.broker.workloads import WorkloadReporter
from nvpair.proxy.cluster.peer import PeerDoor
from nvpair.proxy.dispatch.relay import forwardHeaders
from nvpair.proxy.dispatch.stallwatch import StallWatches
from nvpair.proxy.dispatch.upstream import Upstream
from nvpair.proxy.facade.engines import ENGINES, Engine
from nvpair.proxy.facade.facade import BindError, Facade, parseAlias
from nvpair.proxy.facade.fleet import Fleet
from nvpair.proxy.facade.frontdoor import FrontDoor
from nvpair.proxy.facade.hostcheck import HostGate, HostRule
from nvpair.proxy.facade.listener import PersonalityFactory
from nvpair.proxy.facade.ports import PortError, PortStore, requestedPort
from nvpair.proxy.http.site import FacadeSite, sendError
from nvpair.proxy.interfaces import IBrokerSink, IMessageHandler, IRequestContext
from nvpair.proxy.ops.interfaces import IOpsView
from nvpair.proxy.ops.metrics import Metrics
from nvpair.proxy.options import LEVELS, Settings
from nvpair.proxy.routing.affinity import Affinity
from nvpair.proxy.routing.candidates import Snapshot, parseNodes
from nvpair.proxy.routing.reservations import ReservationMap, parsePriority
from nvpair.proxy.runtime.logs import LogControl, TextStream, makeObserver

SHUTDOWN_GRACE = 3.0


@implementer(IMessageHandler, IOpsView, IRequestContext)
class ProxyService(MultiService):
    """The whole proxy process below the twistd plugin."""

    log = Logger()

    def __init__(
        self,
        settings: Settings,
        reactor: Any,
        logStream: TextStream | None = None,
        trust: Any = None,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.reactor = reactor
        self.clock = reactor
        self.logControl = LogControl(settings.logLevel)
        self.logStream = logStream
        self.sink: IBrokerSink = NullSink()
        self.ports = PortStore(settings.stateDir)
        self.reservations = ReservationMap()
        self.trust = trust
        self.upstream = Upstream(reactor, settings.dialTimeout, trust)
        self.metrics = Metrics()
        self.stalls = StallWatches(reactor, settings.streamIdleTimeout)
        # Standalone with ``--affinity prefix`` sets this (the proxy then orders candidates).
        self.affinity: Affinity | None = None
        self.hosts = HostGate(HostRule(settings.allowedHosts), self.metrics.hostDenied)
        self.reporter = WorkloadReporter(self._sinkProxy, reactor)
        self.activity = Activity(self._sinkProxy)
        self.fleet = Fleet(self)
        self.facades: dict[str, Facade] = {}
        self.exchanges: set[Any] = set()
        self.channel: BrokerChannel | None = None
        self.forwardHeaders = forwardHeaders
        self.sendError = self._sendError

    # -- twistd integration ---------------------------------------------------------------

    def setServiceParent(self, parent: Any) -> None:
        """Attach the JSON stderr log observer to the twistd application (keeps stdout clean)."""
        if isinstance(parent, Componentized) and self.logStream is not None:
            parent.setComponent(ILogObserver, makeObserver(self.logStream, self.logControl))
        super().setServiceParent(parent)

    @property
    def _sinkProxy(self) -> IBrokerSink:
        return _Forward(self)

    # -- start and stop -------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        if self.trust is not None:
            self.trust.start()
        if self.settings.standalone:
            from nvpair.proxy.facade.standalone import startStandalone

            startStandalone(self)
        else:
            from twisted.internet.stdio import StandardIO

            channel = BrokerChannel(self, self._brokerGone)
            self.channel = channel
            self.sink = channel
            StandardIO(channel, reactor=self.reactor)
        if self.settings.opsPort is not None:
            from nvpair.proxy.ops.server import startOps

            startOps(self, self.settings.opsPort)
        self.log.info("started", standalone=self.settings.standalone)

    def _brokerGone(self) -> None:
        self.log.info("broker-closed")
        if self.reactor.running:
            self.reactor.stop()

    def stopService(self) -> defer.Deferred[None]:
        """Stop accepting, cancel in-flight requests, close the pool."""
        self.log.info("stopping", inFlight=len(self.exchanges))
        for exchange in list(self.exchanges):
            exchange.shutdown()
        if self.trust is not None:
            self.trust.stop()
        d = defer.maybeDeferred(super().stopService)
        d.addBoth(lambda _: self.upstream.close())
        d.addTimeout(SHUTDOWN_GRACE, self.clock)
        d.addErrback(lambda f: self.log.warn("shutdown-incomplete", problem=f.getErrorMessage()))
        return d.addCallback(lambda _: None)

    # -- facades --------------------------------------------------------------------------

    def _makeFactory(self, facade: Facade, aliasOnly: bool) -> PersonalityFactory:
        s = self.settings
        site = FacadeSite(
            FrontDoor(self, facade, self.fleet, self.hosts),
            self.clock,
            s.maxBody,
            s.headerReadTimeout,
            s.maxHeaderBytes,
        )
        tls: Callable[[Any], IProtocol | None] | None = None
        if self.trust is not None and not aliasOnly:
            peerSite = FacadeSite(
                PeerDoor(self, facade),
                self.clock,
                s.maxBody,
                s.headerReadTimeout,
                s.maxHeaderBytes,
            )
            trust = self.trust

            def tls(addr: Any) -> IProtocol | None:
                if not (trust.isMember and trust.hasCredentials):
                    return None
                factory = TLSMemoryBIOFactory(trust.serverContextFactory, False, peerSite)
                return factory.buildProtocol(addr)

        return PersonalityFactory(
            self.clock,
            site,
            tls,
            loopbackOnly=aliasOnly,
            maxConnections=s.maxConnections,
            firstByteTimeout=s.headerReadTimeout,
        )

    def enableFacade(
        self, engine: Engine, port: int, aliases: list[str], ignorePersisted: bool
    ) -> Facade:
        """Create, bind and start a facade; raises ``BindError`` with nothing left bound."""
        facade = Facade(
            engine,
            self.reactor,
            lambda aliasOnly: self._makeFactory(facade, aliasOnly),
            Snapshot((), engine.normalize),
        )
        persisted = None
        if not ignorePersisted:
            try:
                persisted = self.ports.load(engine)
            except ValueError as e:
                self.facadeProblem(engine.id, "state", str(e))
        if persisted is not None and persisted != port:
            try:
                problems = facade.listen(persisted, aliases)
            except BindError as e:
                # The port the user chose cannot be listened on again: keep the engine
                # reachable on the requested one and say so (spec §3.2, protocol §4).
                self.facadeProblem(
                    engine.id,
                    "listen",
                    f"the persisted port {persisted} could not be re-listened ({e.reason}); "
                    f"using port {port}",
                )
                problems = facade.listen(port, aliases)
        else:
            problems = facade.listen(port, aliases)
        for alias, reason in problems:
            self.facadeProblem(engine.id, "alias", f"alias {alias} is occupied: {reason}")
        self.facades[engine.id] = facade
        facade.setServiceParent(self)
        self.log.info("facade-enabled", engine=engine.id, port=facade.port, aliases=facade.aliases)
        return facade

    def facadeProblem(self, engineId: str, kind: str, message: str) -> None:
        """Report a non-fatal facade problem as ``<engine>:errors:report``."""
        self.log.warn("facade-problem", engine=engineId, kind=kind, problem=message)
        self.sink.notify(f"{engineId}:errors:report", {"kind": kind, "message": message})

    def _ready(self, facade: Facade) -> None:
        self.sink.notify(
            f"{facade.engine.id}:ready", {"port": facade.port, "aliases": list(facade.aliases)}
        )

    # -- broker messages ------------------------------------------------------------------

    def handle(self, engine: str | None, name: str, params: dict[str, Any]) -> object:
        """Dispatch one broker message (protocol §4), counting it and any error answer."""
        try:
            result = self._route(engine, name, params)
        except RPCError as e:
            self.metrics.rpcMessage(name, e.code)
            raise
        except Exception:
            self.metrics.rpcMessage(name, jsonrpc.INTERNAL_ERROR)
            raise
        self.metrics.rpcMessage(name)
        return result

    def _route(self, engine: str | None, name: str, params: dict[str, Any]) -> object:
        if engine is None:
            handler = self._processHandlers.get(name)
            if handler is None:
                raise RPCError(jsonrpc.METHOD_NOT_FOUND, "method not found")
            return handler(self, params)
        facadeHandler = self._facadeHandlers.get(name)
        if facadeHandler is None:
            raise RPCError(jsonrpc.METHOD_NOT_FOUND, "method not found")
        facade = self.facades.get(engine)
        if facade is None:
            raise RPCError(jsonrpc.FACADE_NOT_ENABLED, "facade not enabled")
        return facadeHandler(self, facade, params)

    def _enable(self, params: dict[str, Any]) -> object:
        engineId = params.get("engine")
        if not isinstance(engineId, str) or engineId not in ENGINES:
            raise RPCError(jsonrpc.INVALID_PARAMS, "unknown engine")
        engine = ENGINES[engineId]
        existing = self.facades.get(engineId)
        if existing is not None:
            return {"engine": engineId, "port": existing.port, "aliases": list(existing.aliases)}
        if "port" not in params:
            raise RPCError(jsonrpc.INVALID_PARAMS, "port is required")
        try:
            port = requestedPort(engine, params["port"])
        except PortError as e:
            raise RPCError(jsonrpc.INVALID_PARAMS, str(e)) from None
        aliases = params.get("aliases") or []
        if not isinstance(aliases, list):
            raise RPCError(jsonrpc.INVALID_PARAMS, "aliases must be a list")
        try:
            for alias in aliases:
                parseAlias(alias)
        except ValueError as e:
            raise RPCError(jsonrpc.INVALID_PARAMS, str(e)) from None
        ignore = params.get("ignorePersistedPort", False)
        if not isinstance(ignore, bool):
            raise RPCError(jsonrpc.INVALID_PARAMS, "ignorePersistedPort must be a boolean")
        try:
            facade = self.enableFacade(engine, port, aliases, ignore)
        except BindError as e:
            self._bindFailed(engine, e)
        result = {"engine": engineId, "port": facade.port, "aliases": list(facade.aliases)}

        def after() -> None:
            self.sink.notify(f"{engineId}:discovery:subscribe", {})
            self._ready(facade)

        return Reply(result, after)

    def _bindFailed(self, engine: Engine, e: BindError) -> None:
        self.log.warn("bind-failed", engine=engine.id, port=e.port, reason=e.reason)
        self.sink.notify(f"{engine.id}:error", {"kind": "bind", "port": e.port, "message": str(e)})
        raise RPCError(
            jsonrpc.BIND_FAILED, str(e), {"engine": engine.id, "port": e.port, "reason": e.reason}
        )

    def _setPort(self, facade: Facade, params: dict[str, Any]) -> object:
        engine = facade.engine
        try:
            port = requestedPort(engine, params.get("port"))
        except PortError as e:
            raise RPCError(jsonrpc.INVALID_PARAMS, str(e)) from None
        try:
            facade.move(port)
        except BindError as e:
            self._bindFailed(engine, e)
        try:
            self.ports.save(engine, port)
        except OSError as e:
            self.facadeProblem(engine.id, "state", f"cannot persist the port: {e.strerror}")
        self.log.info("facade-moved", engine=engine.id, port=port)
        return Reply({"port": port}, lambda: self._ready(facade))

    def _discoveryNodes(self, facade: Facade, params: dict[str, Any]) -> object:
        try:
            nodes = parseNodes(params)
        except ValueError as e:
            raise RPCError(jsonrpc.INVALID_PARAMS, str(e)) from None
        facade.setSnapshot(Snapshot(nodes, facade.engine.normalize))
        if self.logControl.enabled("debug"):
            self.log.debug("discovery", engine=facade.engine.id, nodes=len(nodes))
        return None

    def _select(self, facade: Facade, params: dict[str, Any]) -> object:
        nodeId = params.get("nodeId")
        if nodeId is not None and not isinstance(nodeId, str):
            raise RPCError(jsonrpc.INVALID_PARAMS, "nodeId must be a string or null")
        facade.pin = nodeId
        return None

    def _localBackend(self, facade: Facade, params: dict[str, Any]) -> object:
        url = params.get("url")
        if not isinstance(url, str) or not url.startswith("http://") or len(url) <= 7:
            raise RPCError(jsonrpc.INVALID_PARAMS, "url must be an http:// URL")
        facade.setLocalBackend(url)
        return None

    def _priority(self, params: dict[str, Any]) -> object:
        try:
            generation, order, load = parsePriority(params)
        except ValueError as e:
            raise RPCError(jsonrpc.INVALID_PARAMS, str(e)) from None
        applied = self.reservations.applyPriority(generation, order, load)
        if self.logControl.enabled("debug"):
            self.log.debug("priority", generation=generation, applied=applied)
        return None

    def _setLevel(self, params: dict[str, Any]) -> object:
        level = params.get("level")
        if isinstance(level, str) and level.lower() == "warning":
            level = "warn"
        if not isinstance(level, str) or level.lower() not in LEVELS:
            raise RPCError(jsonrpc.INVALID_PARAMS, "level must be debug, info, warn or error")
        self.logControl.setLevel(level.lower())
        return {"level": level.lower()}

    _processHandlers: dict[str, Callable[[ProxyService, dict[str, Any]], object]] = {
        "facade/enable": _enable,
        "node/set-priority": _priority,
        "log/set-level": _setLevel,
    }
    _facadeHandlers: dict[str, Callable[[ProxyService, Facade, dict[str, Any]], object]] = {
        "set-port": _setPort,
        "discovery:nodes": _discoveryNodes,
        "node/select": _select,
        "node/set-local-backend": _localBackend,
    }

    # -- the context exchanges report to --------------------------------------------------

    def clusterProblem(self, message: str) -> None:
        """A cluster directory file was unusable; the last good state stays in force."""
        self.log.warn("cluster-problem", problem=message)
        self.sink.notify("errors:report", {"kind": "cluster", "message": message})

    def _sendError(
        self,
        request: Any,
        engine: Engine,
        status: int,
        reason: str,
        message: str,
        retryAfter: int | None = None,
    ) -> None:
        """Answer with a proxy-generated error (``site.sendError``), counting it by reason."""
        self.metrics.proxyError(engine.id, reason)
        sendError(request, engine, status, reason, message, retryAfter)

    def reportInternal(self, exceptionType: str) -> None:
        """An unexpected exception handling a request (names the type only)."""
        self.metrics.internalError()
        self.sink.notify(
            "errors:report", {"kind": "internal", "message": f"unexpected {exceptionType}"}
        )

    def attemptFailed(self, exchange: Any, outcome: Any) -> None:
        """An attempt ended uncommitted."""
        self.metrics.attemptFailed(exchange, outcome)
        self.reporter.history.attempt(
            exchange.engine.id, outcome.node.id, outcome.kind, outcome.status
        )
        if self.logControl.enabled("debug"):
            self.log.debug(
                "attempt-failed",
                engine=exchange.engine.id,
                node=outcome.node.id,
                kind=outcome.kind,
                status=outcome.status,
            )

    def committed(self, exchange: Any, nodeId: str) -> None:
        """A response committed on ``nodeId``."""
        self.metrics.committed(exchange, nodeId, self.clock.seconds() - exchange.createdAt)
        self.reporter.history.attempt(exchange.engine.id, nodeId, None, None)

    def requestEnded(self, exchange: Any) -> None:
        """An exchange ended (its terminal bookkeeping has run)."""
        self.metrics.requestEnded(exchange)


@implementer(IBrokerSink)
class _Forward:
    """A sink that forwards to whatever the service's current sink is."""

    __slots__ = ("_service",)

    def __init__(self, service: ProxyService) -> None:
        self._service = service

    @property
    def listening(self) -> bool:
        """Whether anything receives notifications now (not in standalone mode)."""
        return getattr(self._service.sink, "listening", True)

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self._service.sink.notify(method, params)


def stderrStream() -> IO[str]:
    """The process's real stderr, captured before twistd redirects standard I/O."""
    return sys.stderr
