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

import functools
from collections.abc import Callable, Sequence
from enum import Enum

from twisted.application.service import IServiceCollection, Service
from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from zope.interface import Attribute, implementer

from nvpair.proxy.engines import ENGINES, Engine
from nvpair.proxy.facade import inventory
from nvpair.proxy.facade.enginepoller import startEngineState
from nvpair.proxy.facade.facade import BindError, Facade, IFacadeHost
from nvpair.proxy.facade.fleet import NODE_GRACE, NodeAnswer, askNode
from nvpair.proxy.facade.fleetfile import Backend
from nvpair.proxy.facade.modelactor import ModelActions
from nvpair.proxy.facade.reload import FleetReloader, IFleetFollower, UrlFollower
from nvpair.proxy.features import useStandalone
from nvpair.proxy.interfaces import IRequestContext, IUpstream
from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.routing.candidates import Snapshot
from nvpair.proxy.routing.nodes import Node

POLL_INTERVAL = 5.0
DRAIN_CHECK = 1.0

log = Logger()


class IStandaloneProcess(IFacadeHost, IServiceCollection):
    """The process as standalone mode uses it: facades to enable, a service tree to hang
    the pollers on, and the request context whose candidates they fill."""

    context: IRequestContext = Attribute("The request context (standalone may set affinity).")
    metrics = Attribute("The process's metrics (``ops.metrics.Metrics``: fleet reloads).")


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


@implementer(IFleetFollower)
class FleetPoller(Service):
    """Keeps one facade's standalone snapshot: every engine's inventory, polled.

    ``backends`` is the fleet as configured (``Backend``: engine, url, name,
    ``maxConcurrency``); ``setBackends`` follows a reloaded fleet file.  A removed backend
    with requests in flight (``inFlight``) stays in the snapshot with no models, so it
    takes no new request while its pending attempts are not abandoned, until it is idle.
    """

    log = Logger()

    def __init__(
        self,
        facade: Facade,
        urls: Sequence[str],
        upstream: IUpstream,
        clock: IReactorTime,
        timeout: float,
        interval: float = POLL_INTERVAL,
        inFlight: Callable[[str], int] = lambda url: 0,
        onInventory: Callable[[str, int | None], None] | None = None,
    ) -> None:
        self.facade = facade
        self.onInventory = onInventory  # told each poll's model count (None: failed)
        self.engine: Engine = facade.engine
        self.name = f"standalone-{self.engine.id}"
        self.urls = tuple(urls)
        self.backends = tuple(Backend(self.engine.id, url) for url in self.urls)
        self.inFlight = inFlight
        self.draining: dict[str, None] = {}  # removed URLs still serving, in removal order
        self._drainLoop: task.LoopingCall | None = None
        self.upstream = upstream
        self.clock = clock
        self.timeout = timeout
        self.interval = interval
        self.inventories: dict[str, tuple[str, ...]] = {url: () for url in self.urls}
        self.up = dict.fromkeys(self.urls, BackendState.UNKNOWN)
        self.polls: dict[str, tuple[float, str]] = {}  # url -> (when, problem or "")
        self._loops: dict[str, task.LoopingCall] = {}
        self._inFlight: dict[str, defer.Deferred[None]] = {}
        self._published: tuple[tuple[str, frozenset[str]], ...] | None = None

    def startService(self) -> None:
        """Publish the fleet with empty inventories, then poll every engine now and later."""
        super().startService()
        self._publish()
        for url in self.urls:
            self._startPolling(url)

    def _startPolling(self, url: str) -> None:
        loop = self._loops[url] = task.LoopingCall(self.poll, url)
        loop.clock = self.clock
        loop.start(self.interval, now=True).addErrback(
            lambda f: self.log.failure("poller-crashed", f, engine=self.engine.id)
        )

    def _stopPolling(self, url: str) -> None:
        loop = self._loops.pop(url, None)
        if loop is not None and loop.running:
            loop.stop()
        d = self._inFlight.get(url)
        if d is not None:
            d.cancel()

    def stopService(self) -> None:
        """Stop polling and abandon the polls in flight."""
        super().stopService()
        for url in list(self._loops):
            self._stopPolling(url)
        for d in list(self._inFlight.values()):
            d.cancel()
        if self._drainLoop is not None and self._drainLoop.running:
            self._drainLoop.stop()

    def setBackends(self, backends: Sequence[Backend]) -> None:
        """Follow a reloaded fleet: new backends are polled at once, kept ones keep their
        inventory and state, removed ones drain (see the class docstring)."""
        old, self.backends = self.urls, tuple(backends)
        self.urls = tuple(dict.fromkeys(b.url for b in backends))
        for url in old:
            if url not in self.urls:
                self._stopPolling(url)
                for table in (self.inventories, self.up, self.polls):
                    table.pop(url, None)
                self.draining[url] = None
        for url in self.urls:
            if url not in old:
                self.draining.pop(url, None)
                self.inventories[url] = ()
                self.up[url] = BackendState.UNKNOWN
                if self.running:
                    self._startPolling(url)
        self._publish()

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
        if not self.running or url not in self.inventories:
            return  # stopped, or removed from the fleet since
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
        if self.onInventory is not None:
            self.onInventory(url, None if models is None else len(models))
        self._publish()

    def _publish(self) -> None:
        """Replace the facade's snapshot when some inventory changed (keeps caches warm)."""
        for url in [u for u in self.draining if self.inFlight(u) <= 0]:
            del self.draining[url]
            self.log.info("backend-removed", engine=self.engine.id, url=url)
        self._watchDrain()
        state = tuple((url, frozenset(self.inventories[url])) for url in self.urls)
        state += tuple((url, frozenset()) for url in self.draining)
        if state == self._published:
            return
        self._published = state
        nodes = [Node(url, False, (url,), models) for url, models in state]
        self.facade.setSnapshot(Snapshot(nodes, self.engine.normalize))

    def _watchDrain(self) -> None:
        """Check every ``DRAIN_CHECK`` seconds while a removed backend still serves."""
        loop = self._drainLoop
        if self.draining and self.running and loop is None:
            loop = self._drainLoop = task.LoopingCall(self._publish)
            loop.clock = self.clock
            loop.start(DRAIN_CHECK, now=False)
        elif not self.draining and loop is not None:
            self._drainLoop = None
            if loop.running:
                loop.stop()


@implementer(IFleetFollower)
class SlotLimits:
    """Gives the room ledger each backend's ``max_concurrency`` (fleet file), at start and
    on every reload: the slots of an engine that reports none."""

    def __init__(self, ledger: RoomLedger) -> None:
        self.ledger = ledger

    def setBackends(self, backends: Sequence[Backend]) -> None:
        for backend in backends:
            self.ledger.configure(backend.url, backend.maxConcurrency)


def sharesPrefixes(reloader: FleetReloader) -> bool:
    """Whether the fleet file in force shares prefix placement across keys."""
    return reloader.spec is not None and reloader.spec.sharePrefixes


def startStandalone(process: IStandaloneProcess) -> None:
    """Enable the facades of the fleet file (``--fleet``) or of ``--engines``, and give
    each its polled fleet."""
    context = process.context
    settings = context.settings
    timeout = settings.dialTimeout + NODE_GRACE
    # The proxy is its own scheduler: one room record per node, the engines' own state and
    # which models each node holds, placement by cache (``--affinity prefix``), a fair
    # queue while every owner is full, node breakers.
    features = useStandalone(context)
    # The engines' own APIs load and unload where the fleet file says so (``preload``,
    # ``unload_idle``).
    actions = ModelActions(context.upstream, context.clock, features.residency)
    features.residency.actions = actions  # a load of ours may make its room (``unload_idle``)
    actions.setServiceParent(process)
    reservations = context.reservations
    reloader: FleetReloader | None = None

    def enable(engineId: str, backends: Sequence[Backend]) -> bool:
        engine = ENGINES[engineId]
        try:
            facade = process.enableFacade(engine, engine.standalonePort, [], False)
        except BindError as e:
            log.error("bind-failed", engine=engineId, port=e.port, reason=e.reason)
            return False
        urls = [b.url for b in backends]
        log.info("standalone-fleet", engine=engineId, backends=urls)
        poller = FleetPoller(
            facade,
            urls,
            context.upstream,
            context.clock,
            timeout,
            inFlight=lambda url: context.activity.inFlight.get(url, 0),
            onInventory=features.residency.setInventory,
        )
        poller.backends = tuple(backends)
        poller.setServiceParent(process)
        statePoller = startEngineState(process, context, features, engine, urls)
        actions.setBackends(engineId, backends)
        limits = SlotLimits(features.ledger)  # ``max_concurrency``: slots when none reported
        limits.setBackends(backends)
        if reloader is not None:
            reloader.follow(engineId, poller)
            reloader.follow(engineId, UrlFollower(statePoller.setBackends))
            reloader.follow(engineId, limits)
            reloader.follow(engineId, actions.follower(engineId))
        return True

    def reorder(order: Sequence[str]) -> None:
        # No scheduler runs here: the order the backends were given stands in for its
        # priority list (with no load of its own), so an idle fleet is tried in that order
        # and reservations still spread concurrent requests over it.  A reload changes the
        # order only: live reservations keep counting.
        order = list(dict.fromkeys(order))
        if reservations.generation is None:
            reservations.applyPriority(0, order, {})
        else:
            reservations.reorder(order)

    if settings.fleetFile is not None:
        reloader = FleetReloader(
            settings.fleetFile, context.clock, enable, reorder, process.metrics.fleetReload
        )
        reloader.followClients(features.queueing.clients.setClients)  # [[client]]: shares
        reloader.first(settings.engines)
        reloader.setServiceParent(process)
        if context.affinity is not None:
            context.affinity.sharesPrefixes = functools.partial(sharesPrefixes, reloader)
        return
    order: list[str] = []
    for engineId in settings.engines:
        urls = fleetUrls(ENGINES[engineId], settings.backends)
        if enable(engineId, [Backend(engineId, url) for url in urls]):
            order.extend(urls)
    reorder(order)
