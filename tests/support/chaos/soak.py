"""One soak run against a real proxy process: the fleet, discovery and scheduler churn, the run.

The traffic (``SoakTraffic``) and the end-of-run checks (``SoakChecks``) are mixins.
"""

from __future__ import annotations

import json
import random
from typing import Any

import treq
from twisted.internet import defer, task

from tests.support.chaos.checks import Report, SoakChecks, openFds, proxyPid, rssKiB
from tests.support.chaos.engine import ChaosEngine
from tests.support.chaos.records import ChaosConfig, Ledger, Sent
from tests.support.chaos.traffic import SoakTraffic
from tests.support.harness import ProxyFixture, directNode, reservedPort


class Soak(SoakTraffic, SoakChecks):
    """One soak run against a real proxy process."""

    def __init__(self, cleanups: Any, reactor: Any, config: ChaosConfig) -> None:
        self.cleanups = cleanups
        self.reactor = reactor
        self.config = config
        self.ledger = Ledger()
        self.engines: list[ChaosEngine] = []
        self.sent: list[Sent] = []
        self.present: set[str] = set()
        self.removals: list[float] = []  # times a node left discovery
        self.empty: list[tuple[float, float]] = []  # intervals with no node at all
        self._emptySince: float | None = None
        self.generation = 0
        self.lastPriority: dict[str, Any] | None = None
        self.opsPort = reservedPort(cleanups)
        self.proxy: ProxyFixture | None = None
        self.port = 0
        self.report = Report()
        self.rssHalf: int | None = None
        self._churning = True

    # -- setup ---------------------------------------------------------------------------

    def argv(self) -> list[str]:
        """The proxy's command line: short timeouts so faults resolve fast."""
        c = self.config
        return [
            "--response-header-timeout",
            f"{c.responseTimeout}s",
            "--backoff-base",
            "20ms",
            "--backoff-max",
            "200ms",
            "--job-deadline",
            f"{c.jobDeadline}s",
            "--max-dispatch-attempts",
            str(c.maxAttempts),
            "--client-write-timeout",
            "10s",
            "--dial-timeout",
            "2s",
            "--ops-port",
            str(self.opsPort),
            "--log-level",
            c.logLevel,
        ]

    def models(self) -> list[str]:
        """The models every engine advertises (Ollama names, normalized with ``:latest``)."""
        return [f"m{i}:latest" for i in range(self.config.models)]

    def nodes(self) -> list[dict[str, Any]]:
        """The discovery snapshot of the nodes currently present."""
        return [directNode(e.name, e) for e in self.engines if e.name in self.present]

    def startEngines(self) -> None:
        """Start the configured number of scripted Ollama engines (``N0``, ``N1``, ...)."""
        for i in range(self.config.engines):
            engine = ChaosEngine(
                self.reactor,
                self.ledger,
                self.config,
                dialect="ollama",
                models=self.models(),
                name=f"N{i}",
            )
            engine.listen(0)
            self.cleanups.addCleanup(engine.close)
            self.engines.append(engine)

    async def setUp(self) -> None:
        """Start the fleet and the proxy, enable the Ollama facade, publish discovery."""
        self.startEngines()
        proxy = self.proxy = ProxyFixture(self.cleanups, self.reactor, self.argv())
        proxy.level = self.config.logLevel  # sync() sets the level: keep the configured one
        await proxy.start()
        self.port = await proxy.enable("ollama")
        self.present = {e.name for e in self.engines}
        await proxy.nodes("ollama", self.nodes())
        self._priority(fresh=True)
        await proxy.sync()

    # -- discovery and scheduler churn -----------------------------------------------------

    def _priority(self, fresh: bool) -> None:
        assert self.proxy is not None
        rng = random.Random(f"{self.config.seed}:priority:{self.generation}")
        if fresh or self.lastPriority is None:
            self.generation += 1
            order = [e.name for e in self.engines]
            rng.shuffle(order)
            load = {n: {"pending": rng.randint(0, 3), "gpuPressure": rng.random()} for n in order}
            self.lastPriority = {"generation": self.generation, "order": order, "load": load}
        self.proxy.notify("node/set-priority", self.lastPriority)

    def _churnOnce(self, rng: random.Random) -> None:
        assert self.proxy is not None
        now = self.reactor.seconds()
        roll = rng.random()
        if roll < 0.04 and self.present:
            # a blackout: every node leaves at once (they rejoin one by one)
            self.present.clear()
            self.removals.append(now)
            self.proxy.notify("ollama:discovery:nodes", {"nodes": []})
            if self._emptySince is None:
                self._emptySince = now
        elif roll < 0.55:
            name = rng.choice([e.name for e in self.engines])
            if name in self.present:
                if len(self.present) > 1 or rng.random() < 0.3:
                    self.present.discard(name)
                    self.removals.append(now)
            else:
                self.present.add(name)
            self.proxy.notify("ollama:discovery:nodes", {"nodes": self.nodes()})
            if not self.present and self._emptySince is None:
                self._emptySince = now
            elif self.present and self._emptySince is not None:
                self.empty.append((self._emptySince, now))
                self._emptySince = None
        elif roll < 0.8:
            self._priority(fresh=True)
        elif roll < 0.92:
            self._priority(fresh=False)  # redelivered
        else:
            stale = dict(self.lastPriority or {})
            stale["generation"] = max(0, self.generation - 3)
            stale["order"] = list(reversed(stale.get("order", [])))
            self.proxy.notify("node/set-priority", stale)

    async def churn(self) -> None:
        """Leave/rejoin discovery and change the scheduler generation until traffic ends."""
        rng = random.Random(f"{self.config.seed}:churn")
        while self._churning:
            await task.deferLater(
                self.reactor, rng.uniform(0.5, 1.5) * self.config.churnEvery, lambda: None
            )
            if self._churning:
                self._churnOnce(rng)
        # end with everyone present, so the fleet is whole for the end-of-run checks
        now = self.reactor.seconds()
        if self._emptySince is not None:
            self.empty.append((self._emptySince, now))
            self._emptySince = None
        self.present = {e.name for e in self.engines}
        assert self.proxy is not None
        await self.proxy.nodes("ollama", self.nodes())

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> Report:
        """Set up, soak, check; return the report (violations listed, never raised)."""
        await self.setUp()
        assert self.proxy is not None
        proxy = self.proxy
        pid = proxyPid(proxy)
        await self.getStatus()  # warm the ops listener before the baseline
        baselineFds = openFds(pid)
        rssStart = rssKiB(pid)
        started = self.reactor.seconds()
        churn = defer.Deferred.fromCoroutine(self.churn())
        await self.traffic()
        self._churning = False
        await churn
        elapsed = self.reactor.seconds() - started
        await proxy.sync()
        status = await self.settle()
        rssEnd = rssKiB(pid)
        fdsEnd = openFds(pid)
        pooled = {e.name: e.openConnections for e in self.engines}
        r = self.report
        f = r.figures
        f["requests"] = len(self.sent)
        f["seconds"] = round(elapsed, 1)
        f["requests/s"] = round(len(self.sent) / elapsed, 1) if elapsed else 0
        f["engine-side requests"] = self.ledger.seq
        f["refusal periods"] = sum(e.refusals for e in self.engines)
        f["discovery removals"] = len(self.removals)
        f["empty discovery periods"] = len(self.empty)
        f["scheduler generations"] = self.generation
        f["reservations at end"] = status.get("reservations")
        f["in-flight at end"] = status.get("inFlight")
        f["requests in progress at end"] = status.get("requestsInProgress")
        f["live workloads at end"] = status.get("workloads", {}).get("live")
        f["pooled upstream connections"] = pooled
        f["fds baseline"] = baselineFds
        f["fds end"] = fdsEnd
        f["fds end minus pooled"] = fdsEnd - sum(pooled.values())
        f["rss start KiB"] = rssStart
        f["rss half KiB"] = self.rssHalf
        f["rss end KiB"] = rssEnd
        half = self.rssHalf or rssEnd
        f["rss growth second half %"] = round(100.0 * (rssEnd - half) / half, 2)
        self.checkAnswers()
        self.checkWorkloads()
        self.checkSecrets()
        if status.get("reservations"):
            r.violations.append(f"reservations left: {status.get('reservations')}")
        if status.get("inFlight"):
            r.violations.append(f"in-flight left: {status.get('inFlight')}")
        if status.get("requestsInProgress"):
            r.violations.append(f"requests in progress: {status.get('requestsInProgress')}")
        if status.get("workloads", {}).get("live"):
            r.violations.append(f"live workloads: {status['workloads']['live']}")
        for name, n in pooled.items():
            if n > 64:
                r.violations.append(f"{name}: {n} upstream connections open (pool limit 64)")
        if fdsEnd - sum(pooled.values()) > baselineFds + 2:
            r.violations.append(
                f"fds {fdsEnd} - pooled {sum(pooled.values())} > baseline {baselineFds}"
            )
        if f["rss growth second half %"] >= 5.0:
            r.violations.append(f"RSS grew {f['rss growth second half %']}% over the second half")
        await proxy.stop()
        closed = await self.upstreamClosed()
        f["upstream connections after stop"] = closed
        if closed:
            r.violations.append(f"upstream connections still open after stop: {closed}")
        return r

    async def getStatus(self) -> dict[str, Any]:
        """``GET /status`` on the ops port."""
        response = await treq.get(f"http://127.0.0.1:{self.opsPort}/status", persistent=False)
        doc: dict[str, Any] = json.loads(await treq.content(response))
        return doc

    async def settle(self) -> dict[str, Any]:
        """The status once nothing is in progress (bounded wait)."""
        status = await self.getStatus()
        for _ in range(100):
            if not status.get("requestsInProgress") and not status.get("inFlight"):
                break
            await task.deferLater(self.reactor, 0.1, lambda: None)
            status = await self.getStatus()
        return status

    async def upstreamClosed(self) -> int:
        """How many engine connections are still open shortly after the proxy exited."""
        for _ in range(50):
            n = sum(e.openConnections for e in self.engines)
            if n == 0:
                return 0
            await task.deferLater(self.reactor, 0.1, lambda: None)
        return sum(e.openConnections for e in self.engines)
