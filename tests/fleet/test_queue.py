"""The queue and the breaker through the real standalone process, with simulated engines
(spec §11 "The queue", "The breaker")."""

from __future__ import annotations

import os
from typing import Any

import treq
from twisted.internet import defer, reactor, task
from twisted.trial.unittest import TestCase
from twisted.web.client import ResponseNeverReceived
from twisted.web.http_headers import Headers

from nvpair.proxy.testing.simengine import SimConfig, SimEngine
from nvpair.proxy.testing.simengine.config import Failure
from tests.support.harness import reservedPort
from tests.support.standaloneharness import StandaloneProxy

SECRET = "Bearer sk-queue-integration-secret"


def chat(tokens: int = 4) -> dict[str, Any]:
    """A small chat asking for ``tokens`` answer tokens."""
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens}


async def until(check: Any, seconds: float = 30.0) -> None:
    """Poll ``check()`` every 20 ms until it is true, failing after ``seconds``."""
    for _ in range(int(seconds / 0.02)):
        if check():
            return
        await task.deferLater(reactor, 0.02, lambda: None)
    raise AssertionError("condition not reached in time")


async def waitForDepth(opsPort: int, depth: int) -> None:
    """Poll the proxy's ``/status`` (bounded) until its queues hold ``depth`` requests: the
    requests sent so far have arrived, in the order sent."""
    for _ in range(1500):
        response = await treq.get(f"http://127.0.0.1:{opsPort}/status", persistent=False)
        document = await response.json()
        queues = document["queueing"]["queues"].get("llamacpp", {})
        if sum(entry["depth"] for entry in queues.values()) >= depth:
            return
        await task.deferLater(reactor, 0.02, lambda: None)
    raise AssertionError(f"the queue never held {depth}")


class QueueProcessTests(TestCase):
    """A one-slot engine that answers busy: the proxy queues, refuses past the bound, and a
    client that leaves the queue never reaches the engine."""

    timeout = 120

    def sim(self, **config: Any) -> SimEngine:
        engine = SimEngine(reactor, SimConfig(models=("m",), **config))
        engine.listen(0)
        self.addCleanup(engine.close)
        return engine

    async def proxy(self, engines: list[SimEngine], *extra: str) -> StandaloneProxy:
        backends = [("llamacpp", e.url) for e in engines]
        proxy = StandaloneProxy(
            self, reactor, ("llamacpp",), backends, ("--affinity", "off", *extra)
        )
        await proxy.start()
        for engine in engines:
            url = engine.url

            def up(record: dict[str, Any], url: str = url) -> bool:
                return record.get("event") == "backend-up" and record["url"] == url

            await proxy.waitForLog(up)
        return proxy

    def post(self, proxy: StandaloneProxy, tokens: int, key: str = SECRET) -> defer.Deferred[Any]:
        return treq.post(
            proxy.url("llamacpp") + "/v1/chat/completions",
            json=chat(tokens),
            headers=Headers({b"Authorization": [key.encode()]}),
            persistent=False,
        )

    @defer.inlineCallbacks
    def test_queueFullDisconnectAndDrain(self):  # type: ignore[no-untyped-def]
        """Busy engine (it served ours before, so its 503 means busy): the next requests
        wait in the proxy; past --queue-max one is refused
        at once (503 queue_full, Retry-After); a queued client that leaves never reaches the
        engine; the rest are served in turn; the secret never reaches the log."""
        # No state endpoints: "full" is learnt from busy answers alone (the other path).
        engine = self.sim(
            slots=1,
            queueMax=0,
            decodeMs=50.0,
            prefillMs=0.0,
            slotsEndpoint=False,
            metricsEndpoint=False,
        )
        ops = reservedPort(self)
        proxy = yield defer.Deferred.fromCoroutine(
            self.proxy(
                [engine], "--queue-max", "3", "--queue-timeout", "60s", "--ops-port", str(ops)
            )
        )
        warm = yield self.post(proxy, 1)  # it has served ours: its 503s mean busy
        self.assertEqual(warm.code, 200)
        yield warm.content()
        first = self.post(proxy, 80)  # 4 s on the one slot (a learnt limit grows after 5 s)
        yield defer.Deferred.fromCoroutine(until(lambda: engine.stats.requests == 2))
        second = self.post(proxy, 1)  # bounced busy once, then waits
        yield defer.Deferred.fromCoroutine(until(lambda: engine.stats.requests == 3))
        leaving = self.post(proxy, 1, "Bearer other")  # waits: the queue is not empty
        yield defer.Deferred.fromCoroutine(waitForDepth(ops, 2))  # in this order
        third = self.post(proxy, 1)
        yield defer.Deferred.fromCoroutine(waitForDepth(ops, 3))
        refused = yield self.post(proxy, 1)
        self.assertEqual(refused.code, 503)
        body = yield refused.json()
        self.assertEqual(body["error"]["code"], "queue_full")
        self.assertGreaterEqual(int(refused.headers.getRawHeaders("retry-after")[0]), 1)
        leaving.cancel()
        # The client's own cancel (wrapped by treq or not): consumed here, so no unhandled
        # failure is left for the garbage collector to log in a later test.
        yield self.assertFailure(leaving, ResponseNeverReceived, defer.CancelledError)
        results = yield defer.DeferredList([first, second, third], consumeErrors=True)
        codes = [r.code for ok, r in results if ok]
        self.assertEqual(codes, [200, 200, 200])
        # warm, first, second's busy bounce, second, third: the one that left never arrived.
        self.assertEqual(engine.stats.requests, 5)
        self.assertTrue(proxy.logs)
        self.assertNotIn("queue-integration-secret", repr(proxy.logs))

    @defer.inlineCallbacks
    def test_breakerDemotesAndHeals(self):  # type: ignore[no-untyped-def]
        """An engine failing fast with 503 stops taking first attempts once its breaker
        opens; every request still succeeds; healed, it serves again after the cool-down."""
        bad = self.sim(failure=Failure(503, 20.0), decodeMs=1.0)
        good = self.sim(decodeMs=1.0)
        proxy = yield defer.Deferred.fromCoroutine(self.proxy([bad, good]))
        for _ in range(30):
            response = yield self.post(proxy, 1)
            self.assertEqual(response.code, 200)
            yield response.content()
        self.assertLessEqual(bad.stats.requests, 8)  # threshold 5, plus a probe or two
        bad.failure = None
        served: list[str] = []

        async def healed() -> None:
            for _ in range(200):
                response = await self.post(proxy, 1)
                await response.content()
                served.extend(response.headers.getRawHeaders("x-nvpair-node") or [])
                if bad.url in served:
                    return
                await task.deferLater(reactor, 0.05, lambda: None)

        yield defer.Deferred.fromCoroutine(healed())
        self.assertIn(bad.url, served)


class SlotLimitProcessTests(TestCase):
    """A fleet file's ``max_concurrency`` is the slots of an engine that reports none: the
    proxy never sends it more at once, and the rest wait in the proxy's queue."""

    timeout = 120

    @defer.inlineCallbacks
    def test_maxConcurrencyHoldsTheRestInTheQueue(self):  # type: ignore[no-untyped-def]
        """One slot, no state endpoints, a 503 for anything beyond the slot: with
        ``max_concurrency = 1`` three concurrent requests are all served, one at a time,
        and the engine never refuses one (without the limit it would)."""
        engine = SimEngine(
            reactor,
            SimConfig(
                models=("m",),
                slots=1,
                queueMax=0,
                decodeMs=20.0,
                prefillMs=0.0,
                slotsEndpoint=False,
                metricsEndpoint=False,
            ),
        )
        engine.listen(0)
        self.addCleanup(engine.close)
        fleet = os.path.abspath(self.mktemp())  # the proxy runs in its own directory
        with open(fleet, "w") as f:
            f.write(
                f'[[backend]]\nengine = "llamacpp"\nurl = "{engine.url}"\nmax_concurrency = 1\n'
            )
        proxy = StandaloneProxy(self, reactor, ("llamacpp",), fleet=fleet)
        yield defer.Deferred.fromCoroutine(proxy.start())

        def up(record: dict[str, Any]) -> bool:
            return record.get("event") == "backend-up" and record["url"] == engine.url

        yield proxy.waitForLog(up)
        requests = [
            treq.post(
                proxy.url("llamacpp") + "/v1/chat/completions",
                json=chat(20),
                headers=Headers({b"Authorization": [f"Bearer client-{i}".encode()]}),
                persistent=False,
            )
            for i in range(3)
        ]
        responses = yield defer.gatherResults(requests)
        self.assertEqual([r.code for r in responses], [200, 200, 200])
        for response in responses:
            yield response.content()
        self.assertEqual(engine.stats.refused, 0)
        self.assertEqual(engine.stats.requests, 3)
