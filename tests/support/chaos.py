"""The chaos soak engine: a faulty fleet, a churning discovery, and an oracle for every answer.

A fleet of ``ChaosEngine`` fake engines draws each request's behaviour at random (seeded per
request and attempt) from refuse, 503, 429, hang after headers, slow first byte, die
mid-stream and answer normally, and records it in a shared ``Ledger`` under the client's
``X-Chaos-Id`` header (which the proxy forwards verbatim).  Meanwhile nodes leave and rejoin
discovery and the scheduler snapshot changes generation (sometimes redelivered, sometimes
stale).  Every client answer is then checked against what its attempts saw (``judge``), the
terminal workload events against the answers, and at the end the process must hold no
reservation, no in-flight dispatch, no extra descriptor and no growing memory.

Used by ``tests/hostile/test_chaos.py`` (CI mode) and ``bench/soak.py`` (long mode).
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import attrs
import treq
from twisted.internet import defer, task
from twisted.internet.interfaces import IDelayedCall
from twisted.web.http_headers import Headers

from nvpair.proxy.testing.fakeengine import (
    Answer,
    Behaviour,
    DieMidStream,
    Drop,
    FakeEngine,
    HangAfterHeaders,
    SlowFirstByte,
    Status,
)
from tests.support.harness import CANARY, ProxyFixture, directNode, freePort

CHAOS_HEADER = "x-chaos-id"
GENERATED_REASONS = {
    502: {"no_owner", "upstream_unreachable"},
    503: {"deadline_exceeded", "owner_unavailable", "attempts_exhausted"},
    504: {"no_content"},
}
STATUS_BODY = b'{"error":"fake engine busy ' + CANARY.encode() + b'"}'

# behaviour label -> what an attempt meeting it may become, unless its node left discovery:
# "full" (commits, complete answer), "cut" (commits, truncated), "status" (a retryable
# status: fails, or answers unchanged when final), "nocontent" (no first byte in time),
# "transport" (fails at the transport).
OUTCOMES: dict[str, set[str]] = {
    "answer": {"full"},
    "slow": {"full", "nocontent"},
    "slowlong": {"nocontent"},
    "hang": {"nocontent"},
    "s503": {"status"},
    "s429": {"status"},
    "die": {"cut", "transport"},
    "drop": {"transport"},
    "refuse": {"transport"},
}
# Verbatim requests are not gated: headers commit them.
VERBATIM_OUTCOMES: dict[str, set[str]] = {
    "answer": {"full"},
    "slow": {"full"},
    "s503": {"status"},
    "s429": {"status"},
    "die": {"cut", "transport"},
    "drop": {"transport"},
    "refuse": {"transport"},
}
INFERENCE_WEIGHTS = {
    "answer": 40,
    "s503": 10,
    "s429": 7,
    "hang": 4,
    "slow": 10,
    "slowlong": 3,
    "die": 9,
    "drop": 8,
    "refuse": 9,
}
VERBATIM_WEIGHTS = {
    "answer": 50,
    "s503": 12,
    "s429": 8,
    "slow": 10,
    "die": 8,
    "drop": 6,
    "refuse": 6,
}


@attrs.define
class ChaosConfig:
    """The knobs of one soak run."""

    requests: int = 2000
    concurrency: int = 24
    engines: int = 5
    models: int = 10
    seed: int = 20240601
    responseTimeout: float = 1.0
    jobDeadline: float = 4.0
    maxAttempts: int = 5
    churnEvery: float = 0.3
    refuseFor: float = 0.15
    slowDelay: float = 0.05
    logLevel: str = "debug"
    clientTimeout: float = 60.0
    progress: Callable[[str], None] | None = None


@attrs.define
class Attempt:
    """One request an engine received for a chaos id."""

    seq: int
    engine: str
    label: str


class Ledger:
    """Every engine-side request of the soak, by chaos id, in arrival order."""

    def __init__(self) -> None:
        self.seq = 0
        self.byId: dict[str, list[Attempt]] = {}

    def record(self, chaosId: str, engine: str, label: str) -> None:
        """Record one arrival."""
        self.seq += 1
        self.byId.setdefault(chaosId, []).append(Attempt(self.seq, engine, label))


class ChaosEngine(FakeEngine):
    """A fake engine whose every request draws its behaviour at random and records it."""

    def __init__(self, reactor: Any, ledger: Ledger, config: ChaosConfig, **kw: Any) -> None:
        super().__init__(reactor, record=False, **kw)
        self.ledger = ledger
        self.config = config
        self.refusing = False
        self.refusals = 0
        self._relisten: IDelayedCall | None = None
        self._closed = False

    def requestReceived(
        self, proto: Any, method: bytes, target: bytes, headers: dict[str, list[str]], body: bytes
    ) -> None:
        path = target.split(b"?", 1)[0]
        ids = headers.get(CHAOS_HEADER)
        if (method == b"GET" and path in self.lists) or not ids:
            super().requestReceived(proto, method, target, headers, body)
            return
        chaosId = ids[0]
        inference = self.routes.get(path) is not None and method == b"POST"
        seen = sum(1 for a in self.ledger.byId.get(chaosId, ()) if a.engine == self.name)
        rng = random.Random(f"{self.config.seed}:{chaosId}:{self.name}:{seen}")
        weights = INFERENCE_WEIGHTS if inference else VERBATIM_WEIGHTS
        label = rng.choices(list(weights), list(weights.values()))[0]
        self.ledger.record(chaosId, self.name, label)
        if label == "refuse":
            self._refuse()
        self.behaviours[:] = [self._behaviour(label, rng)]
        super().requestReceived(proto, method, target, headers, body)

    def _behaviour(self, label: str, rng: random.Random) -> Behaviour:
        timeout = self.config.responseTimeout
        if label == "answer":
            return Answer(chunks=rng.randint(1, 6))
        if label == "s503":
            return Status(503, STATUS_BODY)
        if label == "s429":
            return Status(429, STATUS_BODY)
        if label == "hang":
            return HangAfterHeaders()
        if label == "slow":
            return SlowFirstByte(self.config.slowDelay)
        if label == "slowlong":
            return SlowFirstByte(timeout * 1.6)
        if label == "die":
            return DieMidStream(rng.randint(1, 2))
        return Drop()  # drop, refuse

    def _refuse(self) -> None:
        """Stop listening for a while (new connections are refused), then listen again."""
        if self.refusing or self._closed:
            return
        self.refusing = True
        self.refusals += 1
        port = self.port
        self.stopListening()

        def relisten(tries: int = 0) -> None:
            self._relisten = None
            if self._closed:
                return
            try:
                self.listen(port)
            except Exception:
                if tries < 50:
                    self._relisten = self.clock.callLater(0.05, relisten, tries + 1)
                return
            self.refusing = False

        self._relisten = self.clock.callLater(self.config.refuseFor, relisten)

    def close(self) -> defer.Deferred[None]:
        """Close, cancelling a pending re-listen."""
        self._closed = True
        if self._relisten is not None and self._relisten.active():
            self._relisten.cancel()
        return super().close()


@attrs.define
class Sent:
    """One client request of the soak and what it got."""

    chaosId: str
    kind: str  # "inference", "verbatim", "list"
    method: str
    path: str
    model: str | None
    stream: bool
    start: float
    end: float = 0.0
    status: int | None = None
    node: str | None = None
    attempts: int | None = None
    retryAfter: str | None = None
    body: bytes = b""
    truncated: bool = False
    error: str | None = None  # client-side failure other than truncation (a violation)
    answer: str = ""  # the judged answer class
    state: str | None = None  # expected terminal workload state


def proxyPid(proxy: ProxyFixture) -> int:
    """The proxy process's pid."""
    pid = proxy.process.pid
    assert pid is not None
    return pid


def openFds(pid: int) -> int:
    """How many descriptors the process has open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def rssKiB(pid: int) -> int:
    """The process's resident set size in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


@attrs.define
class Report:
    """The figures and violations of one soak run."""

    figures: dict[str, Any] = attrs.field(factory=dict)
    violations: list[str] = attrs.field(factory=list)
    answers: Counter[str] = attrs.field(factory=Counter)
    behaviours: Counter[str] = attrs.field(factory=Counter)

    def text(self) -> str:
        """A printable summary."""
        lines = ["chaos soak figures:"]
        for k, v in self.figures.items():
            lines.append(f"  {k}: {v}")
        lines.append("  answers: " + ", ".join(f"{k}={v}" for k, v in sorted(self.answers.items())))
        lines.append(
            "  engine behaviours: "
            + ", ".join(f"{k}={v}" for k, v in sorted(self.behaviours.items()))
        )
        lines.append(f"  violations: {len(self.violations)}")
        for v in self.violations[:30]:
            lines.append(f"    {v}")
        return "\n".join(lines)


class Soak:
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
        self.opsPort = freePort()
        self.proxy: ProxyFixture | None = None
        self.port = 0
        self.report = Report()
        self.rssHalf: int | None = None
        self._churning = True

    def log(self, text: str) -> None:
        """Progress output when the config asks for it."""
        if self.config.progress is not None:
            self.config.progress(text)

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

    async def setUp(self) -> None:
        """Start the fleet and the proxy, enable the Ollama facade, publish discovery."""
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

    # -- traffic ---------------------------------------------------------------------------

    def draw(self, index: int) -> Sent:
        """The request number ``index`` (deterministic in the seed)."""
        rng = random.Random(f"{self.config.seed}:req:{index}")
        chaosId = f"c{index}"
        model = f"m{rng.randrange(self.config.models)}"
        roll = rng.random()
        now = self.reactor.seconds()
        if roll < 0.30:
            return Sent(chaosId, "inference", "POST", "/api/chat", model, True, now)
        if roll < 0.42:
            return Sent(chaosId, "inference", "POST", "/api/chat", model, False, now)
        if roll < 0.56:
            return Sent(
                chaosId, "inference", "POST", "/api/generate", model, rng.random() < 0.5, now
            )
        if roll < 0.80:
            return Sent(
                chaosId, "inference", "POST", "/v1/chat/completions", model, rng.random() < 0.5, now
            )
        if roll < 0.90:
            return Sent(chaosId, "verbatim", "POST", "/api/pull", model, False, now)
        if roll < 0.96:
            return Sent(chaosId, "verbatim", "GET", "/api/version", None, False, now)
        return Sent(chaosId, "list", "GET", "/api/tags", None, False, now)

    def payload(self, s: Sent, rng: random.Random) -> tuple[Headers, bytes | None]:
        """Headers and body of a request (the canary in prompt and credentials)."""
        headers = Headers({"X-Chaos-Id": [s.chaosId]})
        if rng.random() < 0.5:
            headers.setRawHeaders("Authorization", [f"Bearer {CANARY}"])
        if s.method == "GET":
            return headers, None
        headers.setRawHeaders("Content-Type", ["application/json"])
        if s.kind == "verbatim":
            doc: dict[str, Any] = {"model": s.model, "insecure": False}
        elif s.path == "/api/generate":
            doc = {"model": s.model, "prompt": f"say {CANARY}", "stream": s.stream}
        else:
            doc = {
                "model": s.model,
                "stream": s.stream,
                "messages": [{"role": "user", "content": f"hello {CANARY}"}],
            }
        return headers, json.dumps(doc).encode()

    async def one(self, index: int) -> None:
        """Send request ``index`` and record what came back."""
        s = self.draw(index)
        self.sent.append(s)
        headers, body = self.payload(s, random.Random(f"{self.config.seed}:pay:{index}"))
        url = f"http://127.0.0.1:{self.port}{s.path}"
        try:
            d = treq.request(s.method, url, headers=headers, data=body, persistent=False)
            d.addTimeout(self.config.clientTimeout, self.reactor)
            response = await d
            s.status = response.code
            s.node = _header(response, b"x-nvpair-node")
            attempts = _header(response, b"x-nvpair-attempts")
            s.attempts = int(attempts) if attempts is not None else None
            s.retryAfter = _header(response, b"retry-after")
            content = treq.content(response)
            content.addTimeout(self.config.clientTimeout, self.reactor)
            try:
                s.body = await content
            except defer.TimeoutError:
                s.error = "body timed out"
            except Exception:
                s.truncated = True
        except Exception as e:
            s.error = f"{type(e).__name__}: {e}"[:200]
        s.end = self.reactor.seconds()

    async def traffic(self) -> None:
        """Drive every request with bounded concurrency; sample RSS halfway."""
        assert self.proxy is not None
        total = self.config.requests
        counter = iter(range(total))
        half = total // 2
        pid = proxyPid(self.proxy)

        async def worker() -> None:
            for index in counter:
                if index == half:
                    self.rssHalf = rssKiB(pid)
                if index and index % 1000 == 0:
                    self.log(f"  {index}/{total} requests sent")
                await self.one(index)

        workers = [defer.Deferred.fromCoroutine(worker()) for _ in range(self.config.concurrency)]
        await defer.gatherResults(workers, consumeErrors=True)

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

    # -- the oracle ------------------------------------------------------------------------

    def churned(self, s: Sent) -> bool:
        """Whether a node left discovery during this request's life (with some slack)."""
        return any(s.start - 0.3 <= t <= s.end + 0.3 for t in self.removals)

    def wasEmpty(self, s: Sent) -> bool:
        """Whether discovery was empty at some point during this request's life."""
        return any(a - 0.3 <= s.end and s.start <= b + 0.3 for a, b in self.empty)

    def checkAnswers(self) -> None:
        """Judge every answer against its attempts; count them."""
        for s in self.sent:
            attempts = self.ledger.byId.get(s.chaosId, [])
            for a in attempts:
                self.report.behaviours[a.label] += 1
            problem = judge(
                s, attempts, self.config, self.churned(s), self.wasEmpty(s), len(self.engines)
            )
            self.report.answers[f"{s.kind}:{s.answer}"] += 1
            if problem:
                self.report.violations.append(
                    f"{s.chaosId} {s.method} {s.path} stream={s.stream} -> {s.status} "
                    f"{s.answer} node={s.node} attempts={s.attempts} "
                    f"seen={[(a.engine, a.label) for a in attempts]}: {problem}"
                )

    def checkWorkloads(self) -> None:
        """Exactly one terminal event per workload, matching the answers per model and state."""
        assert self.proxy is not None
        events: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        seqs: list[int] = []
        for method, info in self.proxy.workloadEvents():
            events.setdefault(info["id"], []).append((method, info))
            seqs.append(info["seq"])
        r = self.report
        if seqs != sorted(seqs) or len(set(seqs)) != len(seqs):
            r.violations.append("workload seq not strictly increasing")
        observed: Counter[tuple[str, str, str | None]] = Counter()
        for wid, evs in events.items():
            terminals = [e for e in evs if e[0] in ("workload:completed", "workload:errored")]
            if len(terminals) != 1:
                r.violations.append(f"workload {wid}: {len(terminals)} terminal events")
                continue
            if evs[-1] is not terminals[0]:
                r.violations.append(f"workload {wid}: events after the terminal one")
            method, info = terminals[0]
            expected = "workload:completed" if info["state"] == "completed" else "workload:errored"
            if method != expected:
                r.violations.append(f"workload {wid}: {method} with state {info['state']}")
            node = info.get("scheduledOn") if "startedAt" in info else None
            observed[(info["model"], info["state"], node)] += 1
        wanted: Counter[tuple[str, str, str | None]] = Counter()
        for s in self.sent:
            if s.kind == "inference" and s.state is not None:
                assert s.model is not None
                node = s.node if s.answer in ("full", "cut", "passthrough") else None
                wanted[(s.model + ":latest", s.state, node)] += 1
        self.report.figures["workloads"] = len(events)
        self.report.figures["workload terminal states"] = dict(
            Counter(state for (_, state, _) in observed.elements())
        )
        if observed != wanted:
            diff = (observed - wanted) + (wanted - observed)
            r.violations.append(
                f"workload terminals differ from answers: "
                f"extra={dict(observed - wanted)} missing={dict(wanted - observed)}"
                if diff
                else "workload mismatch"
            )

    def checkSecrets(self) -> None:
        """The canary never reaches the log, a JSON-RPC message, or a generated error body."""
        assert self.proxy is not None
        canary = CANARY
        leaks = [r for r in self.proxy.logs if canary in json.dumps(r)]
        if leaks:
            self.report.violations.append(f"canary in {len(leaks)} log lines: {leaks[0]}"[:300])
        rpc: list[object] = [m for m in self.proxy.notifications if canary in json.dumps(m)]
        rpc += [p for p in self.proxy.protocolErrors if canary in p]
        if rpc:
            self.report.violations.append(f"canary in {len(rpc)} JSON-RPC messages")
        generated = [
            s for s in self.sent if s.answer.startswith("gen:") and canary.encode() in s.body
        ]
        if generated:
            self.report.violations.append(f"canary in {len(generated)} generated error bodies")
        self.report.figures["log lines"] = len(self.proxy.logs)
        self.report.figures["notifications"] = len(self.proxy.notifications)


def _header(response: Any, name: bytes) -> str | None:
    values = response.headers.getRawHeaders(name)
    return values[0].decode("latin-1") if values else None


def _complete(s: Sent) -> bool:
    """Whether a 200 body is a whole answer of its route."""
    body = s.body
    try:
        if s.kind == "list":
            return isinstance(json.loads(body).get("models"), list)
        if s.kind == "verbatim":
            return "engine" in json.loads(body)
        if s.path.startswith("/api/"):
            lines = [json.loads(x) for x in body.splitlines() if x.strip()]
            return bool(lines) and lines[-1].get("done") is True
        if s.stream:
            return body.rstrip().endswith(b"data: [DONE]")
        return bool(json.loads(body)["choices"][0]["message"]["content"].startswith("tok"))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return False


def _generatedReason(s: Sent) -> str | None:
    try:
        doc = json.loads(s.body)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("error"), dict):
        code = doc["error"].get("code")
        return code if isinstance(code, str) else None
    reason = doc.get("reason")
    return reason if isinstance(reason, str) else None


def classify(s: Sent) -> None:
    """Name the answer a request got: full, cut, passthrough, gen:<reason>, or other."""
    if s.error is not None:
        s.answer = "client-error"
    elif s.node is not None:
        if s.truncated:
            s.answer = "cut"
        elif s.status == 200:
            s.answer = "full" if _complete(s) else "incomplete-200"
        else:
            s.answer = "passthrough"
    elif s.kind == "list":
        s.answer = "full" if s.status == 200 and not s.truncated and _complete(s) else "bad-list"
    else:
        reason = _generatedReason(s)
        s.answer = f"gen:{reason}" if reason else f"unknown-{s.status}"


def judge(
    s: Sent, attempts: list[Attempt], config: ChaosConfig, churned: bool, wasEmpty: bool, fleet: int
) -> str | None:
    """Return why the answer ``s`` got is not one the spec allows for ``attempts``, or None.

    Also sets ``s.answer`` and ``s.state`` (the terminal workload state it implies).
    """
    classify(s)
    answer = s.answer
    if s.kind == "list":
        return None if answer == "full" else f"fleet list answered {s.status}"
    inference = s.kind == "inference"
    outcomes = OUTCOMES if inference else VERBATIM_OUTCOMES
    last = attempts[-1] if attempts else None

    def can(a: Attempt | None, what: str) -> bool:
        if a is None:
            return what == "transport"  # an unrecorded attempt: the connection was refused
        return what in outcomes.get(a.label, set()) or (churned and what == "left")

    if inference:
        s.state = "failed"
        if len(attempts) > config.maxAttempts:
            return f"{len(attempts)} dispatches > {config.maxAttempts}"
    else:
        engines = [a.engine for a in attempts]
        if len(set(engines)) != len(engines):
            return "non-inference request dispatched twice to one node"
        if len(engines) > fleet:
            return "non-inference request dispatched to more nodes than exist"
    # every attempt but the last must have failed (nothing commits twice)
    for a in attempts[:-1]:
        if not (can(a, "status") or can(a, "nocontent") or can(a, "transport") or can(a, "left")):
            return f"attempt {a.label} on {a.engine} could not have failed"
    if answer in ("full", "cut", "passthrough"):
        if last is None or last.engine != s.node:
            return "committed on a node that did not receive it last"
        if s.attempts is not None and not (len(attempts) <= s.attempts <= config.maxAttempts):
            return f"x-nvpair-attempts {s.attempts} inconsistent with {len(attempts)} seen"
        if answer == "passthrough":
            if not can(last, "status") or f"s{s.status}" != last.label:
                return f"status {s.status} passed through from a {last.label} attempt"
            if inference and s.attempts != config.maxAttempts:
                return "a retryable status passed through before the final attempt"
            if CANARY.encode() not in s.body:
                return "passed-through body changed"
            return None
        if not can(last, answer):
            return f"{answer} answer from a {last.label} attempt"
        if inference:
            s.state = "completed"
        return None
    if answer.startswith("gen:"):
        reason = answer[4:]
        if reason not in GENERATED_REASONS.get(s.status or 0, set()):
            return f"generated {s.status} with reason {reason}"
        if s.status == 503 and s.retryAfter is None:
            return "generated 503 without Retry-After"
        if reason == "no_owner":
            if attempts:
                return "no_owner after a dispatch"
            if not (wasEmpty or (churned and not inference)):
                return "no_owner while owners were present"
            return None
        if reason == "attempts_exhausted":
            return "attempts_exhausted (the spec says unreachable)"
        if reason == "owner_unavailable":
            if not inference or not (churned or wasEmpty):
                return "owner_unavailable without any node leaving"
            return None
        if reason == "deadline_exceeded":
            if not inference or len(attempts) >= config.maxAttempts:
                return "deadline_exceeded after the whole budget was dispatched"
            if s.end - s.start < config.jobDeadline * 0.9:
                return f"deadline_exceeded after only {s.end - s.start:.2f}s"
            return None
        if reason == "no_content":
            if not can(last, "nocontent"):
                return f"504 after a {last.label if last else 'refused'} final attempt"
            return None
        if reason == "upstream_unreachable":
            if can(last, "transport") or can(last, "left"):
                return None
            if len(attempts) < (config.maxAttempts if inference else fleet):
                return None  # the final attempt was refused at connect (unrecorded)
            return f"502 after a {last.label if last else '?'} final attempt"
        return None
    return f"answer {answer} (status {s.status}, error {s.error})"
