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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
from nvpair.proxy.nodestate.probes import BadProbe, EngineReport, parseProbe
from nvpair.proxy.nodestate.states import EngineStates
from nvpair.proxy.routing.nodes import Node

FAST = 1.0
SLOW = 5.0
ACTIVE_WINDOW = 10.0
PROBE_TIMEOUT = 2.0


class _Backend:
    __slots__ = ("url", "probe", "due", "interval", "problem", "asking")

    def __init__(self, url: str, now: float) -> None:
        self.url = url
        self.probe = 0  # index into the engine's stateProbes
        self.due = now
        self.interval = FAST
        self.problem: str | None = None  # the problem last logged, None while fine
        self.asking: defer.Deferred[None] | None = None


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
            backend = self.backends.pop(url)
            if backend.asking is not None:
                backend.asking.cancel()
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
            if backend.asking is not None:
                backend.asking.cancel()

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
            if now < backend.due and not self.ledger.unsettled(backend.url):
                continue  # not due, and its last report did not race with our requests
            # The interval recorded with a probe is the time to the next one (its state is
            # fresh for two of them); idle, each next interval doubles up to ``SLOW``.
            backend.due = now + backend.interval
            self.probe(backend)
            if not busy:
                backend.interval = min(SLOW, backend.interval * 2)

    def probe(self, backend: _Backend) -> None:
        """Ask ``backend`` its current state probe; record what it says."""
        probes = self.engine.stateProbes
        path = probes[backend.probe]
        node = Node(backend.url, False, (backend.url,), frozenset())
        self.ledger.probeSent(backend.url)
        asked = askNode(
            self.upstream,
            self.clock,
            PROBE_TIMEOUT,
            node,
            (backend.url,),
            b"GET",
            (path,),
            Headers(),
        )
        interval = backend.interval

        def answered(answer: NodeAnswer) -> None:
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
        if report is not None and self.onReport is not None:
            self.onReport(backend.url, report)
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


def startEngineState(
    parent: IServiceCollection,
    context: IRequestContext,
    features: Standalone,
    engine: Engine,
    urls: Sequence[str],
) -> EnginePoller:
    """Poll ``engine``'s backends ``urls`` into standalone's engine states and room ledger
    under ``parent`` (traffic: any request in flight); reported slot contexts bound the
    prefix index's nodes."""
    states, ledger, affinity = features.states, features.ledger, features.affinity
    index = None if affinity is None else affinity.index

    def reported(nodeId: str, report: EngineReport) -> None:
        if index is not None and report.contextTokens is not None:
            index.setCapacity(nodeId, report.contextTokens)

    poller = EnginePoller(
        engine,
        urls,
        context.upstream,
        context.clock,
        states,
        ledger,
        active=lambda: bool(context.exchanges),
        onReport=reported,
        onForget=None if index is None else index.forget,
    )
    poller.setServiceParent(parent)
    return poller
