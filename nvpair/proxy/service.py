"""The process: a ``MultiService`` of facades sharing one request context and broker link.

``ProxyService`` is the wiring.  It builds the ``context.RequestContext`` every request
reports to, the ``handlers.BrokerHandlers`` that act on broker messages, and the
broker channel (or standalone mode); it enables facades with their listeners, and starts
and stops all of it.  It holds no request state of its own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from typing import IO, cast

from twisted.application.service import MultiService
from twisted.internet import defer
from twisted.internet.interfaces import (
    IAddress,
    IProtocol,
    IReactorCore,
    IReactorFromThreads,
    IReactorTCP,
    IReactorTime,
)
from twisted.logger import ILogObserver, Logger
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.components import Componentized
from zope.interface import implementer

from nvpair.proxy.broker.channel import BrokerChannel, NullSink, SinkSwitch, writeSome
from nvpair.proxy.cluster.membership import ClusterTrust
from nvpair.proxy.cluster.peer import PeerDoor
from nvpair.proxy.context import RequestContext
from nvpair.proxy.dispatch.upstream import Upstream
from nvpair.proxy.engines import Engine
from nvpair.proxy.facade.facade import BindError, Facade
from nvpair.proxy.facade.fleet import Fleet
from nvpair.proxy.facade.frontdoor import FrontDoor
from nvpair.proxy.facade.hostcheck import HostGate, HostRule
from nvpair.proxy.facade.listener import PersonalityFactory
from nvpair.proxy.facade.ports import PortStore
from nvpair.proxy.facade.standalone import IStandaloneProcess
from nvpair.proxy.handlers import BrokerHandlers
from nvpair.proxy.http.site import FacadeSite
from nvpair.proxy.interfaces import IConnectingReactor
from nvpair.proxy.ops.interfaces import IOpsView
from nvpair.proxy.ops.metrics import Metrics
from nvpair.proxy.routing.candidates import Snapshot
from nvpair.proxy.runtime.eventloop import ITurnEnd
from nvpair.proxy.runtime.logs import LogControl, TextStream, makeObserver
from nvpair.proxy.settings import Settings
from nvpair.proxy.tracing.interfaces import ITracer

SHUTDOWN_GRACE = 3.0
STDOUT = 1  # the broker reads JSON-RPC here (protocol §2); StandardIO's own default
TRACE_FLUSH = 2.0  # seconds the trace export may take at stop (within the grace)


@implementer(IStandaloneProcess, IOpsView)
class ProxyService(MultiService):
    """The whole proxy process below the twistd plugin."""

    log = Logger()

    def __init__(
        self,
        settings: Settings,
        reactor: IReactorTCP,
        logStream: TextStream | None = None,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.reactor = reactor
        self.logStream = logStream
        self.logControl = LogControl(settings.logLevel)
        self.metrics = Metrics()
        # Notifications go nowhere until the process starts (the broker channel, or
        # nothing in standalone mode); everything that sends them holds this switch.
        self.sinks = SinkSwitch(NullSink())
        # The cluster trust reports its problems to this process (``clusterProblem``).
        trust = None
        if settings.clusterDir is not None:
            trust = ClusterTrust(settings.clusterDir, IReactorTime(reactor), self.clusterProblem)
        # Twisted's reactors provide both interfaces, declared one by one (Twisted's own
        # ``disttrial`` casts its reactor the same way).
        self.upstream = Upstream(cast(IConnectingReactor, reactor), settings.dialTimeout, trust)
        tracer: ITracer | None = None
        if settings.otel:
            from nvpair.proxy.tracing.setup import startTracing

            tracer = startTracing(IReactorFromThreads(reactor), IReactorTime(reactor))
        self.context = RequestContext(
            settings,
            IReactorTime(reactor),
            self.upstream,
            self.sinks,
            self.metrics,
            self.logControl,
            trust,
            tracer,
        )
        self.facades: dict[str, Facade] = {}
        self.ports = PortStore(settings.stateDir)
        self.handlers = BrokerHandlers(
            self, self.ports, self.sinks, self.metrics, self.context.reservations, self.logControl
        )
        self.hosts = HostGate(HostRule(settings.allowedHosts), self.metrics.hostDenied)
        self.fleet = Fleet(self.context)
        self.channel: BrokerChannel | None = None

    # -- twistd integration ---------------------------------------------------------------

    def setServiceParent(self, parent: object) -> None:
        """Attach the JSON stderr log observer to the twistd application (keeps stdout clean)."""
        if isinstance(parent, Componentized) and self.logStream is not None:
            observer = makeObserver(self.logStream, self.logControl, self.settings.logFormat)
            parent.setComponent(ILogObserver, observer)
        super().setServiceParent(parent)

    # -- start and stop -------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        trust = self.context.trust
        if trust is not None:
            trust.start()
        if self.settings.standalone:
            from nvpair.proxy.facade.standalone import startStandalone

            startStandalone(self)
        else:
            from twisted.internet.stdio import StandardIO

            # StandardIO makes stdout non-blocking before the channel's first turn ends.
            channel = BrokerChannel(
                self.handlers,
                self._brokerGone,
                turnEnd=ITurnEnd(self.reactor, None),
                output=partial(writeSome, STDOUT),
            )
            self.channel = channel
            self.sinks.target = channel
            StandardIO(channel, reactor=self.reactor)
        if self.settings.opsPort is not None:
            from nvpair.proxy.ops.server import startOps

            startOps(self, self.settings.opsPort)
        self.log.info("started", standalone=self.settings.standalone)

    def _brokerGone(self) -> None:
        self.log.info("broker-closed")
        reactor = IReactorCore(self.reactor)
        if reactor.running:
            reactor.stop()

    def stopService(self) -> defer.Deferred[None]:
        """Stop accepting, cancel in-flight requests, close the pool."""
        context = self.context
        self.log.info("stopping", inFlight=len(context.exchanges))
        for exchange in list(context.exchanges):
            exchange.shutdown()
        if context.trust is not None:
            context.trust.stop()
        d = defer.maybeDeferred(super().stopService)
        d.addBoth(lambda _: self.upstream.close())
        tracer = context.tracer
        if tracer is not None:
            # What the stopped requests traced is exported now, within the grace.
            d.addBoth(lambda _: tracer.shutdown(TRACE_FLUSH))
        d.addTimeout(SHUTDOWN_GRACE, context.clock)
        d.addErrback(lambda f: self.log.warn("shutdown-incomplete", problem=f.getErrorMessage()))
        return d.addCallback(lambda _: None)

    # -- facades --------------------------------------------------------------------------

    def _makeFactory(self, facade: Facade, aliasOnly: bool) -> PersonalityFactory:
        s = self.settings
        context = self.context
        # The HTTP layer's refusals are answered in the facade's shape and counted as its
        # generated errors, on both personalities.
        refused = partial(context.metrics.proxyError, facade.engine.id)
        site = FacadeSite(
            FrontDoor(context, facade, self.fleet, self.hosts),
            context.clock,
            s.maxBody,
            s.headerReadTimeout,
            s.maxHeaderBytes,
            facade.engine,
            refused,
        )
        tls: Callable[[IAddress], IProtocol | None] | None = None
        trust = context.trust
        if trust is not None and not aliasOnly:
            peerSite = FacadeSite(
                PeerDoor(context, facade),
                context.clock,
                s.maxBody,
                s.headerReadTimeout,
                s.maxHeaderBytes,
                facade.engine,
                refused,
            )

            def tls(addr: IAddress) -> IProtocol | None:
                if not (trust.isMember and trust.hasCredentials):
                    return None
                factory = TLSMemoryBIOFactory(trust.serverContextFactory, False, peerSite)
                return factory.buildProtocol(addr)

        return PersonalityFactory(
            context.clock,
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
        self.sinks.notify(f"{engineId}:errors:report", {"kind": kind, "message": message})

    def clusterProblem(self, message: str) -> None:
        """A cluster directory file was unusable; the last good state stays in force."""
        self.log.warn("cluster-problem", problem=message)
        self.sinks.notify("errors:report", {"kind": "cluster", "message": message})


def stderrStream() -> IO[str]:
    """The process's real stderr, captured before twistd redirects standard I/O."""
    return sys.stderr
