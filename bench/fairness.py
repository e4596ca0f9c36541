"""The standalone queue and breaker measured with simulated engines (issue 24's targets).

Five scenarios, each against a real ``twistd -n nvpair-proxy --standalone`` and simulated
llama.cpp engines (``nvpair.proxy.testing.simengine``) in this process, on 127.0.0.1:

* ``fairness``: two engines of one slot each that answer 503 when busy; one heavy client
  keeps 12 requests in flight, three light clients send one at a time.  Jain's index over
  the requests served per client, light clients' wait (latency less the service time) p50
  and p95, refusals; with the queue on and with ``--queue-max 0`` (no queue).
* ``burst``: one one-slot engine, ``--queue-max 16``: 400 requests within 80 ms; how many were
  refused and how fast, their ``Retry-After``, every request's final status; then 10
  queued clients that hang up, and whether any reached the engine.
* ``breaker``: three engines of four slots, one answering 503 after 20 ms; 8 clients for
  the run; the bad engine's share of engine-side requests after 2 s, client successes, p50
  latency against a fleet without it; healed, how long until it serves again.
* ``minted`` and ``bound`` (issue 32 items 2 and 3; ``bench/fairshare.py``): an honest app
  against a greedy one that sends a new ``Authorization`` with each request, or keeps more
  than ``--queue-max`` waiting.

    python -m bench.fairness [--seconds 20] [--only fairness,burst,breaker,minted,bound]

Prints a Markdown report and a ``BENCHJSON`` line.  Every loop is bounded in time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import treq
from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorTCP
from twisted.web.http_headers import Headers

from bench.procs import freePort, spawn, stop, twistdCommand
from nvpair.proxy.testing.simengine import SimConfig, SimEngine
from nvpair.proxy.testing.simengine.config import Failure

TOKENS = 10
DECODE_MS = 10.0  # one service time: 10 tokens × 10 ms = 100 ms
SERVICE = TOKENS * DECODE_MS / 1000


def body(tokens: int = TOKENS) -> bytes:
    """A chat asking for ``tokens`` answer tokens."""
    doc = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens}
    return json.dumps(doc).encode()


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values`` (0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def jain(xs: Sequence[float]) -> float:
    """Jain's fairness index of ``xs``."""
    total = sum(xs)
    squares = sum(x * x for x in xs)
    return total * total / (len(xs) * squares) if squares else 1.0


class Proxy:
    """One standalone proxy process over ``urls`` (llama.cpp facade); with ``fleet``, a
    fleet file of those backends followed by that text (``[[client]]`` tables)."""

    def __init__(self, urls: Sequence[str], extra: Sequence[str], fleet: str | None = None) -> None:
        state = tempfile.mkdtemp(prefix="nvpair-bench-fair-")
        self.port = freePort()
        with open(os.path.join(state, "llamacpp-proxy-port.json"), "w") as f:
            json.dump({"port": self.port}, f)
        argv = [*twistdCommand(), "-n", "--pidfile=", "nvpair-proxy", "--standalone"]
        argv += ["--state-dir", state, "--ops-port", "0"]
        argv += ["--affinity", "off", "--log-level", "warn", *extra]
        if fleet is None:
            argv += ["--engines", "llamacpp"]
            for url in urls:
                argv += ["--backend", f"llamacpp={url}"]
        else:
            path = os.path.join(state, "fleet.toml")
            with open(path, "w") as f:
                for url in urls:
                    f.write(f'[[backend]]\nengine = "llamacpp"\nurl = "{url}"\n')
                f.write(fleet)
            argv += ["--fleet", path]
        log = open(os.environ["BENCH_PROXY_LOG"], "wb") if "BENCH_PROXY_LOG" in os.environ else None
        self.proc = spawn(
            argv, stdin=subprocess.DEVNULL, stderr=log or subprocess.DEVNULL, cwd=state
        )
        self.url = f"http://127.0.0.1:{self.port}/v1/chat/completions"

    async def ready(self, reactor: Any, engines: int) -> None:
        """Wait (bounded) until every engine has served a request through the proxy."""
        seen: set[str] = set()
        deadline = time.monotonic() + 30
        while len(seen) < engines and time.monotonic() < deadline:
            # Concurrent requests spread over the owners (sequential ones all go to the first).
            tries = [defer.Deferred.fromCoroutine(post(self.url, None, 1)) for _ in range(engines)]
            for code, _, headers in await defer.gatherResults(tries):
                if code == 200:
                    seen.update(headers.getRawHeaders("x-nvpair-node") or [])
            await task.deferLater(reactor, 0.05, lambda: None)
        if len(seen) < engines:
            raise RuntimeError("the proxy never served from every engine")

    def close(self) -> None:
        stop(self.proc)


def sims(reactor: Any, n: int, **config: Any) -> list[SimEngine]:
    """``n`` simulated engines listening on 127.0.0.1."""
    engines = []
    for i in range(n):
        engine = SimEngine(reactor, SimConfig(models=("m",), name=f"e{i}", **config))
        engine.listen(0)
        engines.append(engine)
    return engines


async def post(url: str, key: str | None, tokens: int = TOKENS) -> tuple[int, float, Any]:
    """One request: status, seconds, response headers."""
    headers = Headers({b"content-type": [b"application/json"]})
    if key is not None:
        headers.setRawHeaders(b"authorization", [key.encode()])
    start = time.monotonic()
    try:
        r = await treq.post(url, body(tokens), headers=headers, persistent=False)
        await r.content()
    except Exception:
        return 0, time.monotonic() - start, None
    return r.code, time.monotonic() - start, r.headers


async def fairnessRun(reactor: Any, seconds: float, queue: bool) -> dict[str, Any]:
    """One heavy client (12 in flight), three light ones (one at a time)."""
    engines = sims(reactor, 2, slots=1, queueMax=0, decodeMs=DECODE_MS, prefillMs=0.0)
    extra = [] if queue else ["--queue-max", "0"]
    proxy = Proxy([e.url for e in engines], extra)
    try:
        await proxy.ready(reactor, 2)
        stopAt = time.monotonic() + seconds
        served: dict[str, int] = {}
        refused: dict[str, int] = {}
        latency: dict[str, list[float]] = {}

        async def client(name: str) -> None:
            while time.monotonic() < stopAt:
                code, took, _ = await post(proxy.url, f"Bearer {name}")
                if code == 200:
                    served[name] = served.get(name, 0) + 1
                    latency.setdefault(name, []).append(took)
                else:
                    refused[name] = refused.get(name, 0) + 1

        clients = [client("heavy") for _ in range(12)] + [client(f"light{i}") for i in range(3)]
        await defer.gatherResults([defer.Deferred.fromCoroutine(c) for c in clients])
        names = ["heavy", "light0", "light1", "light2"]
        lightWaits = [max(0.0, t - SERVICE) for n in names[1:] for t in latency.get(n, [])]
        return {
            "queue": queue,
            "served": {n: served.get(n, 0) for n in names},
            "refused": {n: refused.get(n, 0) for n in names},
            "jain": round(jain([served.get(n, 0) for n in names]), 3),
            "lightWaitP50": round(pct(lightWaits, 0.5), 3),
            "lightWaitP95": round(pct(lightWaits, 0.95), 3),
            "serviceSeconds": SERVICE,
        }
    finally:
        proxy.close()
        for e in engines:
            await e.close()


async def burstRun(reactor: Any) -> dict[str, Any]:
    """400 requests at once on one one-slot engine, --queue-max 16; then hang-ups."""
    (engine,) = sims(reactor, 1, slots=1, queueMax=0, decodeMs=DECODE_MS, prefillMs=0.0)
    proxy = Proxy([engine.url], ["--queue-max", "16", "--queue-timeout", "30s"])
    try:
        await proxy.ready(reactor, 1)
        # The engine's one slot taken, and its busy answer seen: the proxy knows it is full.
        hold = defer.Deferred.fromCoroutine(post(proxy.url, "Bearer holder", 300))
        await task.deferLater(reactor, 0.2, lambda: None)
        bounce = defer.Deferred.fromCoroutine(post(proxy.url, "Bearer bouncer"))
        await task.deferLater(reactor, 0.2, lambda: None)
        # 400 requests: in waves of 50, 10 ms apart (a connect storm of 400 at once would
        # measure the listen backlog's SYN retries, not the queue).
        sent = []
        for wave in range(8):
            sent += [
                defer.Deferred.fromCoroutine(post(proxy.url, f"Bearer c{i % 8}"))
                for i in range(wave * 50, wave * 50 + 50)
            ]
            await task.deferLater(reactor, 0.01, lambda: None)
        # While the queue is still full: single requests, one at a time, timed alone, from
        # a client already holding its share of the queue (one with fewer waiting would
        # take the place of another's newest request instead of being refused).
        single = []
        for _ in range(20):
            code, took, _ = await post(proxy.url, "Bearer c0")
            if code == 503:
                single.append(took)
        results = await defer.gatherResults(sent)
        codes: dict[int, int] = {}
        for code, _, _ in results:
            codes[code] = codes.get(code, 0) + 1
        refusedTimes = [t for code, t, _ in results if code == 503]
        retryAfter = sorted(
            {int(h.getRawHeaders("retry-after")[0]) for c, _, h in results if c == 503 and h}
        )
        await hold
        await bounce
        # Hang-ups while queued: the slot busy again, a bouncer waiting (the proxy knows the
        # engine is full and the queue is not empty), then 10 clients that queue and hang up.
        hold = defer.Deferred.fromCoroutine(post(proxy.url, "Bearer holder", 100))
        await task.deferLater(reactor, 0.2, lambda: None)
        bounce = defer.Deferred.fromCoroutine(post(proxy.url, "Bearer bouncer"))
        await task.deferLater(reactor, 0.2, lambda: None)
        leaving = [
            treq.post(
                proxy.url,
                body(),
                headers=Headers({b"authorization": [b"Bearer gone"]}),
                persistent=False,
            )
            for _ in range(10)
        ]
        await task.deferLater(reactor, 0.3, lambda: None)
        for d in leaving:
            d.addErrback(lambda _: None)
            d.cancel()
        before = engine.stats.requests  # from the hang-ups on (the holder is running)
        await hold
        await bounce
        await task.deferLater(reactor, 0.5, lambda: None)
        reached = engine.stats.requests - before - 1  # less the bouncer's own run
        return {
            "requests": len(results),
            "finalStatuses": codes,
            "refusedMaxSeconds": round(max(refusedTimes, default=0.0), 3),
            "refusedP50Seconds": round(pct(refusedTimes, 0.5), 3),
            "singleRefusalsWhileFull": len(single),
            "singleRefusalP50Seconds": round(pct(single, 0.5), 4),
            "singleRefusalMaxSeconds": round(max(single, default=0.0), 4),
            "retryAfterValues": retryAfter,
            "hungUpQueued": 10,
            # 0 unless one of the 10 that hung up while queued reached the engine
            "engineRequestsFromHungUp": reached,
        }
    finally:
        proxy.close()
        await engine.close()


async def breakerRun(reactor: Any, seconds: float, withBad: bool) -> dict[str, Any]:
    """Three engines (one failing fast), or the two good ones alone."""
    engines = sims(reactor, 3 if withBad else 2, slots=4, decodeMs=DECODE_MS, prefillMs=0.0)
    bad = engines[0] if withBad else None
    proxy = Proxy([e.url for e in engines], [])
    try:
        await proxy.ready(reactor, len(engines))
        if bad is not None:
            bad.failure = Failure(503, 20.0)
        start = time.monotonic()
        stopAt = start + seconds
        marks: dict[str, int] = {}
        latencies: list[float] = []
        codes: dict[int, int] = {}

        async def client() -> None:
            while time.monotonic() < stopAt:
                code, took, _ = await post(proxy.url, None)
                codes[code] = codes.get(code, 0) + 1
                if code == 200:
                    latencies.append(took)

        async def mark() -> None:
            await task.deferLater(reactor, 2.0, lambda: None)
            marks["bad"] = bad.stats.requests if bad else 0
            marks["all"] = sum(e.stats.requests for e in engines)

        await defer.gatherResults(
            [defer.Deferred.fromCoroutine(client()) for _ in range(8)]
            + [defer.Deferred.fromCoroutine(mark())]
        )
        result: dict[str, Any] = {
            "withBad": withBad,
            "statuses": codes,
            "p50Seconds": round(pct(latencies, 0.5), 4),
        }
        if bad is not None:
            badAfter = bad.stats.requests - marks["bad"]
            allAfter = sum(e.stats.requests for e in engines) - marks["all"]
            result["badShareAfter2s"] = round(badAfter / allAfter, 4) if allAfter else None
            bad.failure = None
            healedAt = time.monotonic()
            back = None
            while time.monotonic() - healedAt < 60:
                _, _, headers = await post(proxy.url, None)
                if headers is not None and bad.url in (
                    headers.getRawHeaders("x-nvpair-node") or []
                ):
                    back = time.monotonic() - healedAt
                    break
                await task.deferLater(reactor, 0.02, lambda: None)
            result["healedServesAfterSeconds"] = None if back is None else round(back, 2)
        return result
    finally:
        proxy.close()
        for e in engines:
            await e.close()


async def main(reactor: IReactorTCP, argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fairness")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--only", default="fairness,burst,breaker,minted,bound")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    report: dict[str, Any] = {}
    if "fairness" in only:
        report["fairness"] = [
            await fairnessRun(reactor, args.seconds, True),
            await fairnessRun(reactor, args.seconds, False),
        ]
    if "burst" in only:
        report["burst"] = await burstRun(reactor)
    if "breaker" in only:
        report["breaker"] = [
            await breakerRun(reactor, args.seconds / 2, True),
            await breakerRun(reactor, args.seconds / 2, False),
        ]
    from bench import fairshare  # its scenarios use this module's proxy and engines

    if "minted" in only:
        report["minted"] = await fairshare.mintedRuns(reactor, args.seconds / 2)
    if "bound" in only:
        report["bound"] = await fairshare.boundRuns(reactor, args.seconds / 2)
    print(json.dumps(report, indent=1))
    print("BENCHJSON " + json.dumps(report))
    sys.stdout.flush()


if __name__ == "__main__":
    task.react(lambda reactor: defer.Deferred.fromCoroutine(main(reactor, sys.argv[1:])))
