"""Polling the engines' own state in standalone mode (spec §11.2) into ``EngineStates``.

One ``EnginePoller`` per facade asks each of its backends the engine table's ``stateProbes``
(``askNode``: the upstream pool, one address, a timeout, a bounded read).  It ticks every
``FAST`` seconds; a backend is probed when due: every ``FAST`` seconds while traffic flows
(requests in flight, or within the last ``ACTIVE_WINDOW`` seconds), otherwise at an interval
doubling up to ``SLOW``.  A probe answered 404 or 501 moves that backend to the next probe
path for good (llama.cpp without ``/slots`` falls back to ``/metrics``); one that fails, times
out (``PROBE_TIMEOUT``), is malformed or too large is recorded as unknown.  A backend's
problem is logged when it starts and when it ends, not at every poll (a server that has
no such endpoint at info level, any other problem as a warning).

llama.cpp in router mode (``llama-server`` without ``-m``) answers ``/slots`` 400 (it wants
``?model=``): such a backend is asked the engine's ``routerProbe`` (``GET /models``); when
that lists statuses, the backend is probed as a router from then on: ``/models``, then
``/slots?model=NAME&autoload=false`` of each loaded model (at most ``MAX_CHILDREN``), so a
probe never loads a model (without ``autoload=false`` the router would load it).  A
``/models`` without statuses sends the backend back to the usual probes for good.  While an
engine says a model is loading, it is probed every ``FAST`` seconds, traffic or not.
After a backend's first report it is asked the engine's ``identityProbe`` once (llama.cpp:
``/props``): whether its prompt cache moves saved prompts (``EngineStates.promptsMove``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from urllib.parse import quote

from twisted.application.service import IServiceCollection, Service
from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from nvpair.proxy.engines import Engine
from nvpair.proxy.facade.fleet import NodeAnswer, askNode
from nvpair.proxy.features import Standalone
from nvpair.proxy.interfaces import IRequestContext, IUpstream
from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.probes import (
    LOADING,
    BadProbe,
    EngineReport,
    NotThisProbe,
    parseIdentity,
    parseProbe,
    parseSlots,
    withChildSlots,
)
from nvpair.proxy.nodestate.states import EngineStates
from nvpair.proxy.routing.nodes import Node

FAST = 1.0
SLOW = 5.0
DUE_SLACK = FAST / 4  # a tick this close before a backend is due probes it (timer jitter)
ACTIVE_WINDOW = 10.0
PROBE_TIMEOUT = 2.0
MAX_CHILDREN = 16  # a router's loaded models whose slots are read per probe
ROUTER_SUFFIX = " (router)"


class _Backend:
    __slots__ = (
        *("url", "probe", "due", "interval", "problem", "asking", "router", "notRouter"),
        "identifying",
    )

    def __init__(self, url: str, now: float) -> None:
        self.url = url
        self.probe = 0  # index into the engine's stateProbes
        self.router = False  # a llama.cpp router: probed by its model list
        self.notRouter = False  # its model list said it is not one: never asked again
        self.due = now
        self.interval = FAST
        self.problem: str | None = None  # the problem last logged, None while fine
        self.asking: defer.Deferred[None] | None = None
        self.identifying: defer.Deferred[None] | None = None  # its identity probe in flight

    def abandon(self) -> None:
        """Cancel its probes in flight (the state probe and the identity probe)."""
        for asked in (self.asking, self.identifying):
            if asked is not None:
                asked.cancel()


class EnginePoller(Service):
    """Keeps one facade's backends' engine state in ``EngineStates``."""

    log = Logger()

    def __init__(
        self,
        engine: Engine,
        urls: Sequence[str],
        upstream: IUpstream,
        clock: IReactorTime,
        states: EngineStates,
        ledger: RoomLedger,
        active: Callable[[], bool],
        onReport: Callable[[str, EngineReport], None] | None = None,
        onForget: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.name = f"engine-state-{engine.id}"
        self.upstream = upstream
        self.clock = clock
        self.states = states
        self.ledger = ledger
        self.active = active
        self.onReport = onReport
        self.onForget = onForget
        self.backends: dict[str, _Backend] = {}
        self.lastActive: float | None = None
        self._loop: task.LoopingCall | None = None
        self.setBackends(urls)

    def setBackends(self, urls: Sequence[str]) -> None:
        """Poll these backends from now on (new ones at once; gone ones forgotten)."""
        now = self.clock.seconds()
        wanted = list(dict.fromkeys(urls))
        for url in [u for u in self.backends if u not in wanted]:
            self.backends.pop(url).abandon()
            self.states.forget(url)
            self.ledger.forget(url)
            if self.onForget is not None:
                self.onForget(url)
        for url in wanted:
            if url not in self.backends:
                self.backends[url] = _Backend(url, now)
        if self.running:
            self.tick()

    def startService(self) -> None:
        """Probe every backend now, then tick every ``FAST`` seconds."""
        super().startService()
        if not self.engine.stateProbes:
            return
        loop = self._loop = task.LoopingCall(self.tick)
        loop.clock = self.clock
        loop.start(FAST, now=True).addErrback(
            lambda f: self.log.failure("engine-poller-crashed", f, engine=self.engine.id)
        )

    def stopService(self) -> None:
        """Stop ticking and abandon the probes in flight."""
        super().stopService()
        loop, self._loop = self._loop, None
        if loop is not None and loop.running:
            loop.stop()
        for backend in self.backends.values():
            backend.abandon()

    def busy(self) -> bool:
        """Whether traffic flows: requests now, or within the last ``ACTIVE_WINDOW`` s."""
        now = self.clock.seconds()
        if self.active():
            self.lastActive = now
            return True
        return self.lastActive is not None and now - self.lastActive <= ACTIVE_WINDOW

    def tick(self) -> None:
        """Probe every backend that is due."""
        now = self.clock.seconds()
        busy = self.busy()
        for backend in list(self.backends.values()):
            if busy and backend.interval > FAST:
                backend.interval = FAST  # traffic resumed: probe at once, then often
                backend.due = min(backend.due, now)
            if backend.asking is not None:
                continue
            if now < backend.due - DUE_SLACK and not self.ledger.unsettled(backend.url):
                continue  # not due, and its last report did not race with our requests
            # The interval recorded with a probe is the time to the next one (its state is
            # fresh for two of them); idle, each next interval doubles up to ``SLOW``.
            backend.due = now + backend.interval
            self.probe(backend)
            if not busy:
                backend.interval = min(SLOW, backend.interval * 2)

    def _ask(self, backend: _Backend, path: bytes) -> defer.Deferred[NodeAnswer]:
        node = Node(backend.url, False, (backend.url,), frozenset())
        return askNode(
            self.upstream,
            self.clock,
            PROBE_TIMEOUT,
            node,
            (backend.url,),
            b"GET",
            (path,),
            Headers(),
        )

    def probe(self, backend: _Backend) -> None:
        """Ask ``backend`` its current state probe; record what it says."""
        self.ledger.probeSent(backend.url)  # from now until the answer: the probe race
        if backend.router:
            self.probeRouter(backend)
            return
        probes = self.engine.stateProbes
        path = probes[backend.probe]
        asked = self._ask(backend, path)
        interval = backend.interval
        routerProbe = self.engine.routerProbe

        def answered(answer: NodeAnswer) -> None:
            if answer.status == 400 and routerProbe is not None and not backend.notRouter:
                backend.router = True  # perhaps a router wanting ?model=: ask its list now
                backend.due = self.clock.seconds()
                self._record(backend, None, interval, path, "status 400", False)
                return
            if answer.status in (404, 501) and backend.probe + 1 < len(probes):
                backend.probe += 1  # this server has no such endpoint: the next, for good
                backend.due = self.clock.seconds()
                self._record(backend, None, interval, path, f"status {answer.status}", False)
                return
            if not 200 <= answer.status < 300:
                self._record(backend, None, interval, path, f"status {answer.status}")
                return
            try:
                report = parseProbe(path, answer.body)
            except BadProbe as e:
                self._record(backend, None, interval, path, str(e))
                return
            self._record(backend, report, interval, path, "")

        def failed(failure: Failure) -> None:
            problem = "timed out" if failure.check(defer.TimeoutError) else "unreachable"
            self._record(backend, None, interval, path, problem)

        def settled(result: None) -> None:
            if backend.asking is d:
                backend.asking = None

        d = asked.addCallbacks(answered, failed)
        backend.asking = d
        d.addBoth(settled)

    def probeRouter(self, backend: _Backend) -> None:
        """Ask a llama.cpp router its model list, then each loaded model's slots (never
        loading one: ``autoload=false``); record the whole as one report."""
        path = self.engine.routerProbe or b"/models"
        interval = backend.interval
        probe = path + ROUTER_SUFFIX.encode()

        async def ask() -> None:
            try:
                answer = await self._ask(backend, path)
            except defer.TimeoutError:
                self._record(backend, None, interval, probe, "timed out")
                return
            except defer.CancelledError:
                raise
            except Exception:
                self._record(backend, None, interval, probe, "unreachable")
                return
            if not 200 <= answer.status < 300:
                self._record(backend, None, interval, probe, f"status {answer.status}")
                return
            try:
                report = parseProbe(path, answer.body)
            except NotThisProbe:
                backend.router, backend.notRouter = False, True  # back to the usual probes
                backend.due = self.clock.seconds()
                return
            except BadProbe as e:
                self._record(backend, None, interval, probe, str(e))
                return
            loaded = sorted(report.loaded or ())[:MAX_CHILDREN]
            asked = [
                defer.Deferred.fromCoroutine(self._childSlots(backend, model)) for model in loaded
            ]
            slots = await defer.gatherResults(asked, consumeErrors=True) if asked else []
            report = withChildSlots(report, dict(zip(loaded, slots, strict=True)))
            self._record(backend, report, interval, probe, "")

        def settled(result: object) -> None:
            if backend.asking is d:
                backend.asking = None

        d: defer.Deferred[None] = defer.Deferred.fromCoroutine(ask())
        backend.asking = d
        d.addErrback(lambda f: f.trap(defer.CancelledError)).addBoth(settled)

    async def _childSlots(self, backend: _Backend, model: str) -> EngineReport | None:
        """One router model's ``/slots`` (``autoload=false``), or None when unreadable."""
        target = b"/slots?model=" + quote(model, safe="").encode() + b"&autoload=false"
        try:
            answer = await self._ask(backend, target)
            if not 200 <= answer.status < 300:
                return None
            return parseSlots(answer.body)
        except defer.CancelledError:
            raise
        except Exception:
            return None

    def _record(
        self,
        backend: _Backend,
        report: EngineReport | None,
        interval: float,
        path: bytes,
        problem: str,
        log: bool = True,
    ) -> None:
        if not self.running or self.backends.get(backend.url) is not backend:
            return
        probe = path.decode("latin-1")
        self.states.record(backend.url, report, interval, probe, problem)
        if report is None:
            self.ledger.probeFailed(backend.url)
        else:
            self.ledger.probed(backend.url, report.busy, report.total, interval)
        if report is not None and any(m.state == LOADING for m in report.resident or ()):
            # A model is loading there: probe often, to see it loaded (and time the load).
            backend.interval = FAST
            backend.due = min(backend.due, self.clock.seconds() + FAST)
        if report is not None and self.onReport is not None:
            self.onReport(backend.url, report)
        if report is not None:
            self.identify(backend)
        if not log:
            return
        if problem and backend.problem is None:
            # A server without the endpoint is a setup, not a fault: said at info level.
            unsupported = problem in ("status 404", "status 501")
            emit = self.log.info if unsupported else self.log.warn
            emit(
                "engine-state-unknown", engine=self.engine.id, url=backend.url, probe=probe,
                problem=problem,
            )  # fmt: skip
        elif not problem and backend.problem is not None:
            self.log.info("engine-state-read", engine=self.engine.id, url=backend.url, probe=probe)
        backend.problem = problem or None

    def identify(self, backend: _Backend) -> None:
        """Ask ``backend`` the engine's identity probe unless it answered or is asked; a
        2xx answer says whether its prompt cache moves, any other status that it does not,
        a failure nothing (asked again after its next report)."""
        path = self.engine.identityProbe
        if path is None or backend.identifying is not None:
            return
        if self.states.identity(backend.url) is not None:
            return

        def answered(answer: NodeAnswer) -> None:
            if self.running and self.backends.get(backend.url) is backend:
                moves = 200 <= answer.status < 300 and parseIdentity(answer.body)
                self.states.identified(backend.url, moves)

        def settled(result: object) -> None:
            backend.identifying = None

        asked = self._ask(backend, path).addCallbacks(answered, lambda f: None)
        backend.identifying = asked
        asked.addBoth(settled)


def startEngineState(
    parent: IServiceCollection,
    context: IRequestContext,
    features: Standalone,
    engine: Engine,
    urls: Sequence[str],
) -> EnginePoller:
    """Poll ``engine``'s backends ``urls`` into standalone's engine states, room ledger and
    residency view under ``parent`` (traffic: any request in flight); reported slot
    contexts bound the prefix index's nodes; a backend that leaves is forgotten by all."""
    states, ledger, affinity = features.states, features.ledger, features.affinity
    residency = features.residency
    forget = residency.forget
    index = None if affinity is None else affinity.index

    def reported(nodeId: str, report: EngineReport) -> None:
        residency.observe(nodeId, report)
        if index is not None and report.contextTokens is not None:
            index.setCapacity(nodeId, report.contextTokens)

    def forgotten(nodeId: str) -> None:
        if index is not None:
            index.forget(nodeId)
        if forget is not None:
            forget(nodeId)

    poller = EnginePoller(
        engine,
        urls,
        context.upstream,
        context.clock,
        states,
        ledger,
        active=lambda: bool(context.exchanges),
        onReport=reported,
        onForget=forgotten,
    )
    poller.setServiceParent(parent)
    return poller
