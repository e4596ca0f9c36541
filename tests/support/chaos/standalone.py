"""The chaos soak in standalone mode, with the queue and the breakers on (issue 24).

The same faulty fleet of ``ChaosEngine`` nodes and the same oracle, behind a real
``--standalone`` process (``StandaloneProxy``) with a small ``--queue-max`` and a short
``--queue-timeout``, so that 429/503 answers fill the queue and refusing engines open their
breakers.  There is no discovery churn (a standalone fleet is static) and no broker: the
terminal workload states are checked against ``/status``'s counts, and at the end nothing
may wait in a queue.  The fleet still empties when every backend's model poll fails at
once (engines that stop listening for a while, a poll timing out on a starved machine): the
proxy logs each ``backend-down`` and ``backend-up``, and the stretches with every backend
down count as an empty discovery, as a broker's empty node list does.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from twisted.internet import defer

from tests.support.chaos.checks import Report, openFds
from tests.support.chaos.soak import Soak
from tests.support.harness import CANARY
from tests.support.standaloneharness import StandaloneProxy

QUEUE_ARGS = ("--queue-max", "8", "--queue-timeout", "1s")


class StandaloneSoak(Soak):
    """One soak run against a standalone proxy with the queue and breakers on."""

    standalone: StandaloneProxy | None = None

    async def setUpStandalone(self) -> None:
        """Start the fleet and the standalone proxy over it; wait until every engine is up."""
        self.startEngines()
        backends = [("ollama", e.url) for e in self.engines]
        proxy = StandaloneProxy(
            self.cleanups, self.reactor, ("ollama",), backends, (*self.argv(), *QUEUE_ARGS)
        )
        self.standalone = proxy
        await proxy.start()
        for engine in self.engines:
            url = engine.url

            def up(record: dict[str, Any], url: str = url) -> bool:
                return record.get("event") == "backend-up" and record["url"] == url

            await proxy.waitForLog(up, timeout=60.0)
        self.port = proxy.ports["ollama"]
        self.present = {e.name for e in self.engines}

    async def drive(self) -> None:
        """Every request with bounded concurrency."""
        counter = iter(range(self.config.requests))

        async def worker() -> None:
            for index in counter:
                await self.one(index)

        workers = [defer.Deferred.fromCoroutine(worker()) for _ in range(self.config.concurrency)]
        await defer.gatherResults(workers, consumeErrors=True)

    async def runStandalone(self) -> Report:
        """Set up, soak, check; return the report (violations listed, never raised)."""
        await self.setUpStandalone()
        proxy = self.standalone
        assert proxy is not None and proxy.proto is not None
        pid = proxy.proto.transport.pid  # type: ignore[union-attr]
        await self.getStatus()
        baselineFds = openFds(pid)
        started = self.reactor.seconds()
        await self.drive()
        elapsed = self.reactor.seconds() - started
        status = await self.settle()
        fdsEnd = openFds(pid)
        names = {e.url: e.name for e in self.engines}
        for s in self.sent:  # standalone node ids are the engines' URLs
            s.node = names.get(s.node, s.node) if s.node is not None else None
        r = self.report
        f = r.figures
        f["requests"] = len(self.sent)
        f["seconds"] = round(elapsed, 1)
        f["engine-side requests"] = self.ledger.seq
        pooled = {e.name: e.openConnections for e in self.engines}
        f["fds end minus pooled"] = fdsEnd - sum(pooled.values())
        f["fds baseline"] = baselineFds
        self.empty.extend(downWindows(proxy.logs, len(self.engines), self.reactor.seconds()))
        f["empty discovery periods"] = len(self.empty)
        self.checkAnswers()
        self.checkStandalone(status)
        leaks = [rec for rec in proxy.logs if CANARY in repr(rec)]
        if leaks:
            r.violations.append(f"canary in {len(leaks)} log lines")
        if fdsEnd - sum(pooled.values()) > baselineFds + 2:
            r.violations.append(f"fds {fdsEnd} - pooled {sum(pooled.values())} > {baselineFds}")
        await proxy.stop()
        return r

    def checkStandalone(self, status: dict[str, Any]) -> None:
        """Nothing held at the end, nothing waiting; terminal counts match the answers."""
        r = self.report
        f = r.figures
        for key in ("reservations", "inFlight", "requestsInProgress"):
            if status.get(key):
                r.violations.append(f"{key} left: {status.get(key)}")
        workloads = status.get("workloads", {})
        if workloads.get("live"):
            r.violations.append(f"live workloads: {workloads['live']}")
        queueing = status.get("queueing") or {}
        depths = {
            (engine, model): q["depth"]
            for engine, models in queueing.get("queues", {}).items()
            for model, q in models.items()
        }
        f["queues"] = len(depths)
        f["queue refusals"] = queueing.get("refused")
        f["breakers"] = {
            n: (b["state"], b["opens"]) for n, b in queueing.get("breakers", {}).items()
        }
        if any(depths.values()):
            r.violations.append(f"requests still queued: {depths}")
        if queueing.get("queueMax") != 8:
            r.violations.append("the queue was not on")
        wanted = Counter(s.state for s in self.sent if s.kind == "inference" and s.state)
        terminals = workloads.get("terminals", {})
        f["workload terminal states"] = terminals
        for state in ("completed", "failed"):
            if terminals.get(state, 0) != wanted.get(state, 0):
                r.violations.append(
                    f"{state} workloads {terminals.get(state, 0)} != answers {wanted.get(state, 0)}"
                )


def downWindows(logs: list[dict[str, Any]], backends: int, now: float) -> list[tuple[float, float]]:
    """The stretches (start, end) during which the proxy had logged every one of
    ``backends`` backends down (``backend-down`` until its next ``backend-up``)."""
    down: set[str] = set()
    windows: list[tuple[float, float]] = []
    since: float | None = None
    for record in logs:
        event, url, when = record.get("event"), record.get("url"), record.get("time")
        if event not in ("backend-down", "backend-up") or not isinstance(when, int | float):
            continue
        if event == "backend-down":
            down.add(str(url))
        else:
            down.discard(str(url))
        if len(down) >= backends and since is None:
            since = float(when)
        elif len(down) < backends and since is not None:
            windows.append((since, float(when)))
            since = None
    if since is not None:
        windows.append((since, now))
    return windows
