"""End to end: the real process's ops listener after real requests through fake engines."""

from __future__ import annotations

import json
from typing import Any

import treq
from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase
from twisted.web.http_headers import Headers

from nvpair.proxy.testing.fakeengine import Status
from tests.support.cases.metricstext import Samples, labels, parse
from tests.support.harness import CANARY, ProxyFixture, directNode, reservedPort, startEngine


class OpsIntegrationTests(TestCase):
    """Counters scraped from /metrics move as the requests that went through the proxy say."""

    timeout = 90

    async def setUpProxy(self) -> None:
        self.engineA = startEngine(self, reactor, "openai", ["m1"], name="A")
        self.engineB = startEngine(self, reactor, "openai", ["m1"], name="B")
        self.opsPort = reservedPort(self)
        self.proxy = ProxyFixture(self, reactor, ["--ops-port", str(self.opsPort)])
        await self.proxy.start()
        self.port = await self.proxy.enable("llamacpp")
        await self.proxy.nodes(
            "llamacpp", [directNode("A", self.engineA), directNode("B", self.engineB)]
        )

    async def ops(self, path: str) -> tuple[Any, bytes]:
        response = await treq.get(f"http://127.0.0.1:{self.opsPort}{path}", persistent=False)
        body = await treq.content(response)
        return response, body

    async def scrape(self) -> Samples:
        response, body = await self.ops("/metrics")
        self.assertEqual(response.code, 200)
        self.assertNotIn(CANARY.encode(), body)
        return parse(body.decode())

    async def chat(self, model: str) -> Any:
        response = await treq.post(
            f"http://127.0.0.1:{self.port}/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": CANARY}]},
            persistent=False,
        )
        await treq.content(response)
        return response

    def test_metricsAfterRequests(self) -> defer.Deferred[None]:
        """A failover, a proxy error, a verbatim request and an RPC error each move their series."""
        return defer.Deferred.fromCoroutine(self._metricsAfterRequests())

    async def _metricsAfterRequests(self) -> None:
        await self.setUpProxy()
        before = await self.scrape()
        inference2xx = labels(engine="llamacpp", route="inference", outcome="2xx")
        self.assertEqual(before["nvpair_proxy_requests_total", inference2xx], 0.0)

        self.engineA.script(Status(500))  # A fails once with a retryable status; B serves
        response = await self.chat("m1")
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders("x-nvpair-node"), ["B"])
        self.assertEqual(response.headers.getRawHeaders("x-nvpair-attempts"), ["2"])
        missing = await self.chat("no-such-model")
        self.assertEqual(missing.code, 502)
        self.assertIsNone(missing.headers.getRawHeaders("x-nvpair-node"))
        verbatim = await treq.get(f"http://127.0.0.1:{self.port}/health", persistent=False)
        await treq.content(verbatim)
        self.assertIsNotNone(verbatim.headers.getRawHeaders("x-nvpair-node"))
        try:
            await self.proxy.request("no/such-method", {})
        except Exception:
            pass
        else:
            self.fail("an unknown method must be answered with an error")
        await self.proxy.waitFor("workload:completed")
        await self.proxy.sync()

        after = await self.scrape()
        self.assertEqual(after["nvpair_proxy_requests_total", inference2xx], 1.0)
        self.assertEqual(
            after[
                "nvpair_proxy_requests_total",
                labels(engine="llamacpp", route="inference", outcome="error"),
            ],
            1.0,
        )
        verbatimClass = f"{verbatim.code // 100}xx"
        self.assertEqual(
            after[
                "nvpair_proxy_requests_total",
                labels(engine="llamacpp", route="verbatim", outcome=verbatimClass),
            ],
            1.0,
        )
        attempts = "nvpair_proxy_dispatch_attempts_total"
        self.assertEqual(after[attempts, labels(engine="llamacpp", reason="status")], 1.0)
        self.assertEqual(after[attempts, labels(engine="llamacpp", reason="committed")], 2.0)
        self.assertEqual(
            after[
                "nvpair_proxy_commit_seconds_count", labels(engine="llamacpp", route="inference")
            ],
            1.0,
        )
        self.assertEqual(
            after["nvpair_proxy_errors_total", labels(engine="llamacpp", reason="no_owner")], 1.0
        )
        workloads = "nvpair_proxy_workloads_total"
        self.assertEqual(after[workloads, labels(state="completed")], 1.0)
        self.assertEqual(after[workloads, labels(state="failed")], 1.0)
        self.assertEqual(after["nvpair_proxy_workloads_live", labels()], 0.0)
        rpc = "nvpair_proxy_rpc_messages_total"
        self.assertEqual(after[rpc, labels(method="facade/enable")], 1.0)
        self.assertEqual(after[rpc, labels(method="discovery:nodes")], 1.0)
        self.assertGreaterEqual(after[rpc, labels(method="log/set-level")], 1.0)
        self.assertEqual(
            after["nvpair_proxy_rpc_errors_total", labels(method="unknown", code="-32601")], 1.0
        )
        self.assertEqual(after["nvpair_proxy_discovery_nodes", labels(engine="llamacpp")], 2.0)
        self.assertGreaterEqual(after["nvpair_proxy_upstream_pool_connections", labels()], 1.0)
        inFlight = [v for (name, _), v in after.items() if name == "nvpair_proxy_in_flight"]
        self.assertEqual(inFlight, [])
        self.assertEqual(after["nvpair_proxy_requests_in_progress", labels()], 0.0)

    def test_statusAfterRequests(self) -> defer.Deferred[None]:
        """/status lists the facade, its nodes and the finished workloads, never content."""
        return defer.Deferred.fromCoroutine(self._statusAfterRequests())

    async def _statusAfterRequests(self) -> None:
        await self.setUpProxy()
        self.engineA.script(Status(503))
        await self.chat("m1")
        await self.proxy.waitFor("workload:completed")
        response, body = await self.ops("/status")
        self.assertEqual(response.code, 200)
        self.assertNotIn(CANARY.encode(), body)
        doc = json.loads(body)
        facade = doc["facades"]["llamacpp"]
        self.assertEqual(facade["port"], self.port)
        self.assertEqual([n["id"] for n in facade["nodes"]], ["A", "B"])
        confirmed = {n["id"]: n["confirmed"] for n in facade["nodes"]}
        self.assertEqual(confirmed["B"], self.engineB.url)
        (workload,) = doc["workloads"]["recent"]
        self.assertEqual(
            (workload["model"], workload["state"], workload["node"], workload["attempts"]),
            ("m1", "completed", "B", 2),
        )
        self.assertEqual(workload["stats"]["completionTokens"], 3)
        page, html = await self.ops("/")
        self.assertEqual(page.code, 200)
        self.assertIn(b"/status", html)

    def test_preflightHasNoRoutingHeaders(self) -> defer.Deferred[None]:
        """A CORS preflight answer never carries the X-Nvpair routing headers."""
        return defer.Deferred.fromCoroutine(self._preflight())

    async def _preflight(self) -> None:
        await self.setUpProxy()
        response = await treq.request(
            "OPTIONS",
            f"http://127.0.0.1:{self.port}/v1/chat/completions",
            headers=Headers(
                {"Origin": ["http://app.example"], "Access-Control-Request-Method": ["POST"]}
            ),
            persistent=False,
        )
        await treq.content(response)
        self.assertIsNone(response.headers.getRawHeaders("x-nvpair-node"))
        self.assertIsNone(response.headers.getRawHeaders("x-nvpair-attempts"))
        metrics = await self.scrape()
        self.assertEqual(
            sum(v for (name, _), v in metrics.items() if name == "nvpair_proxy_requests_total"), 0.0
        )
