"""Standalone mode (protocol §9): facades without a broker, fleets of direct engines.

Each enabled facade gets a static fleet: the ``--backend ENGINE=URL`` entries for its
engine, in the order given (or one node at the engine's default address), each node's id
being its URL.  A ``FleetPoller`` asks every engine for its model list at start and every
``POLL_INTERVAL`` seconds and replaces the facade's snapshot when an inventory changed; an
engine that does not answer has an empty inventory until it answers again.  Everything
else (routing, failover, reservations, statistics) reads that snapshot exactly as it
reads the broker's, except that with ``--affinity prefix`` (the default) the request
context gets an ``affinity.Affinity`` that orders the candidates of inference requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from twisted.application.service import IServiceCollection, Service
from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from zope.interface import Attribute

from nvpair.proxy.dispatch.queueing import Queueing
from nvpair.proxy.engines import ENGINES, Engine
from nvpair.proxy.facade import inventory
from nvpair.proxy.facade.facade import BindError, Facade, IFacadeHost
from nvpair.proxy.facade.fleet import NODE_GRACE, NodeAnswer, askNode
from nvpair.proxy.interfaces import IRequestContext, IUpstream
from nvpair.proxy.routing.affinity import Affinity
from nvpair.proxy.routing.candidates import Node, Snapshot

POLL_INTERVAL = 5.0

log = Logger()


class IStandaloneProcess(IFacadeHost, IServiceCollection):
    """The process as standalone mode uses it: facades to enable, a service tree to hang
    the pollers on, and the request context whose candidates they fill."""

    context: IRequestContext = Attribute("The request context (standalone may set affinity).")


class BackendState(Enum):
    """What the polls say of one engine (a change is logged once)."""

    UNKNOWN = "unknown"
    """Not answered yet."""
    UP = "up"
    """Its last poll read a model list."""
    DOWN = "down"
    """Its last poll failed: its inventory counts as empty."""


def fleetUrls(engine: Engine, backends: Sequence[tuple[str, str]]) -> list[str]:
    """The URLs of ``engine``'s standalone fleet: its ``--backend`` entries or its default."""
    urls = [url.rstrip("/") for engineId, url in backends if engineId == engine.id]
    if not urls:
        urls = [engine.defaultBackend]
    return list(dict.fromkeys(urls))


class FleetPoller(Service):
    """Keeps one facade's standalone snapshot: every engine's inventory, polled."""

    log = Logger()

    def __init__(
        self,
        facade: Facade,
        urls: Sequence[str],
        upstream: IUpstream,
        clock: IReactorTime,
        timeout: float,
        interval: float = POLL_INTERVAL,
    ) -> None:
        self.facade = facade
        self.engine: Engine = facade.engine
        self.name = f"standalone-{self.engine.id}"
        self.urls = tuple(urls)
        self.upstream = upstream
        self.clock = clock
        self.timeout = timeout
        self.interval = interval
        self.inventories: dict[str, tuple[str, ...]] = {url: () for url in self.urls}
        self.up = dict.fromkeys(self.urls, BackendState.UNKNOWN)
        self.polls: dict[str, tuple[float, str]] = {}  # url -> (when, problem or "")
        self._loops: list[task.LoopingCall] = []
        self._inFlight: dict[str, defer.Deferred[None]] = {}
        self._published: tuple[tuple[str, frozenset[str]], ...] | None = None

    def startService(self) -> None:
        """Publish the fleet with empty inventories, then poll every engine now and later."""
        super().startService()
        self._publish()
        for url in self.urls:
            loop = task.LoopingCall(self.poll, url)
            loop.clock = self.clock
            self._loops.append(loop)
            loop.start(self.interval, now=True).addErrback(
                lambda f: self.log.failure("poller-crashed", f, engine=self.engine.id)
            )

    def stopService(self) -> None:
        """Stop polling and abandon the polls in flight."""
        super().stopService()
        loops, self._loops = self._loops, []
        for loop in loops:
            if loop.running:
                loop.stop()
        for d in list(self._inFlight.values()):
            d.cancel()

    def poll(self, url: str) -> defer.Deferred[None]:
        """Ask the engine at ``url`` for its model list and record what it advertises."""
        node = Node(url, False, (url,), frozenset())
        asked = askNode(
            self.upstream,
            self.clock,
            self.timeout,
            node,
            (url,),
            b"GET",
            (self.engine.inventoryRoute,),
            Headers(),
        )
        path = self.engine.inventoryRoute.decode("latin-1")

        def answered(answer: NodeAnswer) -> tuple[tuple[str, ...] | None, str]:
            if not 200 <= answer.status < 300:
                return None, f"status {answer.status}"
            try:
                return tuple(inventory.modelNames(path, answer.body)), ""
            except inventory.InvalidList as e:
                return None, str(e)

        def failed(failure: Failure) -> tuple[tuple[str, ...] | None, str]:
            return None, type(failure.value).__name__

        d = asked.addCallbacks(answered, failed).addCallback(self._record, url)
        self._inFlight[url] = d
        d.addBoth(self._settled, url)
        return d

    def _settled(self, result: object, url: str) -> None:
        self._inFlight.pop(url, None)

    def _record(self, outcome: tuple[tuple[str, ...] | None, str], url: str) -> None:
        """One poll's outcome: the engine's models, or ``None`` and why it is counted down."""
        if not self.running:
            return
        models, problem = outcome
        state = BackendState.DOWN if models is None else BackendState.UP
        self.polls[url] = (self.clock.seconds(), problem)
        if self.up[url] is not state:
            if models is not None:
                self.log.info("backend-up", engine=self.engine.id, url=url, models=len(models))
            else:
                self.log.warn("backend-down", engine=self.engine.id, url=url, problem=problem)
            self.up[url] = state
        self.inventories[url] = models or ()
        self._publish()

    def _publish(self) -> None:
        """Replace the facade's snapshot when some inventory changed (keeps caches warm)."""
        state = tuple((url, frozenset(self.inventories[url])) for url in self.urls)
        if state == self._published:
            return
        self._published = state
        nodes = [Node(url, False, (url,), models) for url, models in state]
        self.facade.setSnapshot(Snapshot(nodes, self.engine.normalize))


def startStandalone(process: IStandaloneProcess) -> None:
    """Enable the facades named by ``--engines`` and give each its polled static fleet."""
    context = process.context
    settings = context.settings
    timeout = settings.dialTimeout + NODE_GRACE
    if settings.affinity == "prefix":
        # The proxy orders the candidates itself: keep conversations where their cache is.
        context.affinity = Affinity(context.clock)
    order: list[str] = []
    for engineId in settings.engines:
        engine = ENGINES[engineId]
        try:
            facade = process.enableFacade(engine, engine.standalonePort, [], False)
        except BindError as e:
            log.error("bind-failed", engine=engineId, port=e.port, reason=e.reason)
            continue
        urls = fleetUrls(engine, settings.backends)
        order.extend(urls)
        log.info("standalone-fleet", engine=engineId, backends=urls)
        poller = FleetPoller(facade, urls, context.upstream, context.clock, timeout)
        poller.setServiceParent(process)
    # No scheduler runs here: the order the backends were given stands in for its priority
    # list (with no load of its own), so an idle fleet is tried in that order and
    # reservations still spread concurrent requests over it.
    context.reservations.applyPriority(0, list(dict.fromkeys(order)), {})
    # The proxy is its own scheduler: a fair queue while every owner is full, node breakers.
    queueing = Queueing(settings, context.clock, context.activity.inFlight, context.engineStates)
    context.queueing = queueing
    context.activity.listener = queueing.activityChanged
