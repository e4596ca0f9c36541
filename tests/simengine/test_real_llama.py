"""The simulated engine's llama.cpp shapes against the real llama-server (Gemma 3 270M).

Runs where ``NVPAIR_LLAMA_SERVER_BIN`` names a ``llama-server`` binary and
``NVPAIR_LLAMA_MODEL`` a GGUF, or else the checkout's ``.venv-llama-server`` has them
(``demo/install-llama-server.sh``, run by ``.ci/run``); skipped, saying why, otherwise
(``tests/support/llamaserver.py``). The same requests go to the real server and to a
simulated engine on the same reactor; every field the simulation writes must exist in the
real answer, and the cached-token numbers must agree with each other as the real server's do.
"""

from __future__ import annotations

import json
from typing import Any

import treq
from treq.client import HTTPClient
from twisted.internet import reactor as _reactor
from twisted.internet.interfaces import IReactorTCP
from twisted.trial.unittest import TestCase
from twisted.web.client import Agent, HTTPConnectionPool

from nvpair.proxy.nodestate.probes import parseMetrics, parseSlots
from nvpair.proxy.routing.stats import StatsMeter
from nvpair.proxy.testing.simengine import SimConfig, SimEngine
from tests.simengine.helpers import sentence
from tests.support.llamaserver import startLlamaServer

reactor: Any = _reactor


class RealLlamaServerTests(TestCase):
    """What the simulation says in llama.cpp's dialect, llama-server says too."""

    timeout = 600

    async def start(self) -> None:
        """Start llama-server (2 slots, --metrics) and a simulated engine like it."""
        server = await startLlamaServer(
            self, reactor, "-np", "2", "--ctx-size", "8192", "--metrics"
        )
        self.http = HTTPClient(Agent(reactor, pool=HTTPConnectionPool(IReactorTCP(reactor), False)))
        self.real = server.url
        sim = SimEngine(reactor, SimConfig(slots=2, nCtx=4096, prefillMs=0.1, decodeMs=1.0))
        sim.listen()
        self.addCleanup(sim.close)
        self.sim = sim.url

    async def call(self, base: str, path: str, doc: object = None) -> tuple[int, bytes]:
        """One request; status and body."""
        if doc is None:
            response = await self.http.get(base + path)
        else:
            response = await self.http.post(base + path, data=json.dumps(doc).encode())
        return response.code, await treq.content(response)

    def assertSubset(self, sim: dict[str, Any], real: dict[str, Any], where: str) -> None:
        """Every key the simulation writes is one the real server writes."""
        self.assertEqual(set(sim) - set(real), set(), where)

    async def test_slotsAndMetrics(self) -> None:
        """/slots and /metrics: the simulation's fields and metric names are the real ones."""
        await self.start()
        _, real = await self.call(self.real, "/slots")
        _, sim = await self.call(self.sim, "/slots")
        realSlots, simSlots = json.loads(real), json.loads(sim)
        self.assertEqual(len(realSlots), len(simSlots))
        for r, s in zip(realSlots, simSlots, strict=True):
            self.assertSubset(s, r, "slot")
            self.assertEqual((r["is_processing"], r["n_ctx"]), (False, 4096))
        names = {}
        for base in (self.real, self.sim):
            _, text = await self.call(base, "/metrics")
            lines = text.decode().splitlines()
            names[base] = {line.split()[0] for line in lines if line and not line.startswith("#")}
        self.assertEqual(names[self.sim] - names[self.real], set())
        self.assertIn("llamacpp:requests_deferred", names[self.real])
        # The proxy's own probes read the real server: all slots idle, their contexts summed.
        report = parseSlots(real)
        self.assertEqual((report.busy, report.total), (0, len(realSlots)))
        self.assertEqual(report.contextTokens, sum(r["n_ctx"] for r in realSlots))
        _, metrics = await self.call(self.real, "/metrics")
        self.assertEqual(parseMetrics(metrics).busy, 0)

    async def test_cachedTokens(self) -> None:
        """A repeated long prompt: cached_tokens and timings as the real server reports them."""
        await self.start()
        doc = {
            "messages": [
                {"role": "system", "content": sentence(600)},
                {"role": "user", "content": "hi"},
            ],
            "max_tokens": 4,
        }
        bodies: dict[str, Any] = {}
        for base in (self.real, self.sim):
            await self.call(base, "/v1/chat/completions", doc)
            status, body = await self.call(base, "/v1/chat/completions", doc)
            self.assertEqual(status, 200)
            bodies[base] = json.loads(body)
        real, sim = bodies[self.real], bodies[self.sim]
        self.assertSubset(sim, real, "body")
        self.assertSubset(sim["usage"], real["usage"], "usage")
        self.assertSubset(sim["timings"], real["timings"], "timings")
        for doc_ in (real, sim):
            usage, timings = doc_["usage"], doc_["timings"]
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            self.assertGreater(cached, usage["prompt_tokens"] // 2)
            self.assertEqual(cached, timings["cache_n"])
            self.assertEqual(usage["prompt_tokens"], timings["cache_n"] + timings["prompt_n"])
        # The proxy's statistics meter reads the real answer's cached count.
        meter = StatsMeter("openai", 0.0)
        meter.firstByte(0.0)
        meter.feed(json.dumps(real).encode())
        stats = meter.result(1.0)
        assert stats is not None
        self.assertEqual(
            stats["cachedTokens"], real["usage"]["prompt_tokens_details"]["cached_tokens"]
        )

    async def test_streamTail(self) -> None:
        """Streamed: timings on the last chunk; usage only with include_usage, choices empty."""
        await self.start()
        for includeUsage in (False, True):
            doc: dict[str, Any] = {
                "messages": [{"role": "user", "content": "hello there"}],
                "max_tokens": 3,
                "stream": True,
            }
            if includeUsage:
                doc["stream_options"] = {"include_usage": True}
            tails = {}
            for base in (self.real, self.sim):
                _, body = await self.call(base, "/v1/chat/completions", doc)
                events = [
                    json.loads(line[5:])
                    for line in body.decode().splitlines()
                    if line.startswith("data:") and line[5:].strip() != "[DONE]"
                ]
                tails[base] = events[-1]
            real, sim = tails[self.real], tails[self.sim]
            self.assertSubset(sim, real, f"tail, include_usage={includeUsage}")
            self.assertIn("timings", real)
            self.assertEqual("usage" in real, includeUsage)
            if includeUsage:
                self.assertEqual(real["choices"], [])
