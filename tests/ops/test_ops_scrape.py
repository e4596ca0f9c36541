"""The ops listener's ``GET /metrics`` (spec §13), in memory: live state read at scrape
time, workloads, discovery, the upstream pool and event counters; and the service hooks
that count broker messages and the proxy's own error answers."""

from __future__ import annotations

import json
from typing import cast

from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.test.requesthelper import DummyRequest

from nvpair.proxy.broker.channel import RPCError
from nvpair.proxy.http.client import HTTPClientConnection
from nvpair.proxy.http.interfaces import IServerRequest
from tests.ops.opskit import ENGINE, EndpointTestCase, makeService, samples


class MetricsEndpointTests(EndpointTestCase):
    """GET /metrics."""

    def scrape(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        response, body = self.get("http://localhost:9464/metrics")
        self.assertEqual(response.code, 200)
        self.assertTrue(
            response.headers.getRawHeaders("content-type")[0].startswith(
                "text/plain; version=0.0.4"
            )
        )
        return samples(body.decode())

    def test_liveState(self) -> None:
        """In-flight, reservations, estimated load and generation are read at scrape time."""
        values = self.scrape()
        self.assertEqual(values["nvpair_proxy_in_flight", frozenset({("node", "A")})], 1.0)
        self.assertEqual(values["nvpair_proxy_reservations", frozenset({("node", "A")})], 1.0)
        self.assertEqual(values["nvpair_proxy_estimated_load", frozenset({("node", "A")})], 3.5)
        self.assertEqual(values["nvpair_proxy_scheduler_generation", frozenset()], 7.0)
        self.service.context.activity.change("A", -1)
        self.service.context.activity.change("me", +2)
        values = self.scrape()
        self.assertNotIn(("nvpair_proxy_in_flight", frozenset({("node", "A")})), values)
        self.assertEqual(values["nvpair_proxy_in_flight", frozenset({("node", "me")})], 2.0)

    def test_workloadsAndDiscovery(self) -> None:
        """Workload terminal states, live workloads and discovery sizes."""
        values = self.scrape()
        state = "nvpair_proxy_workloads_total"
        self.assertEqual(values[state, frozenset({("state", "completed")})], 1.0)
        self.assertEqual(values[state, frozenset({("state", "failed")})], 1.0)
        self.assertEqual(values[state, frozenset({("state", "cancelled")})], 0.0)
        self.assertEqual(values["nvpair_proxy_workloads_live", frozenset()], 1.0)
        engine = frozenset({("engine", "llamacpp")})
        self.assertEqual(values["nvpair_proxy_discovery_nodes", engine], 2.0)
        self.assertEqual(values["nvpair_proxy_discovery_updates_total", engine], 1.0)

    def test_pool(self) -> None:
        """Idle pooled upstream connections are counted from the shared pool."""
        self.assertEqual(self.scrape()["nvpair_proxy_upstream_pool_connections", frozenset()], 0.0)
        pool = self.service.upstream.pool
        keys = [("http", b"a", 1), ("http", b"a", 1), ("http", b"b", 1)]
        idle = [HTTPClientConnection(pool, key) for key in keys]
        for conn in idle:
            pool.release(conn)
        try:
            values = self.scrape()
        finally:
            for conn in idle:
                pool.lost(conn)
        self.assertEqual(values["nvpair_proxy_upstream_pool_connections", frozenset()], 3.0)
        self.assertEqual(values["nvpair_proxy_upstream_pool_hosts", frozenset()], 2.0)

    def test_events(self) -> None:
        """Event counters fed through the service's hooks appear in the same scrape."""
        self.service.metrics.proxyError("llamacpp", "no_owner")
        self.service.handlers.handle(None, "log/set-level", {"level": "info"})
        values = self.scrape()
        self.assertEqual(
            values[
                "nvpair_proxy_errors_total",
                frozenset({("engine", "llamacpp"), ("reason", "no_owner")}),
            ],
            1.0,
        )
        self.assertEqual(
            values["nvpair_proxy_rpc_messages_total", frozenset({("method", "log/set-level")})], 1.0
        )


class _ChatRequest(DummyRequest):
    """A request for the chat completions path (what the error shape is chosen by)."""

    path = b"/v1/chat/completions"


class ServiceHookTests(SynchronousTestCase):
    """The service feeds broker messages and its own error answers to the metrics."""

    def setUp(self) -> None:
        self.service = makeService(MemoryReactorClock())

    def value(self, name: str, **labels: str) -> float | None:
        for family in self.service.metrics.registry.collect():
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        return None

    def test_rpcErrors(self) -> None:
        """An error answer counts the message and the error by method and code."""
        self.assertRaises(
            RPCError, self.service.handlers.handle, None, "log/set-level", {"level": "x"}
        )
        self.assertRaises(RPCError, self.service.handlers.handle, None, "made/up", {})
        self.assertRaises(RPCError, self.service.handlers.handle, "ollama", "node/select", {})
        self.assertEqual(self.value("nvpair_proxy_rpc_messages_total", method="log/set-level"), 1.0)
        self.assertEqual(
            self.value("nvpair_proxy_rpc_errors_total", method="log/set-level", code="-32602"), 1.0
        )
        self.assertEqual(
            self.value("nvpair_proxy_rpc_errors_total", method="unknown", code="-32601"), 1.0
        )
        self.assertEqual(
            self.value("nvpair_proxy_rpc_errors_total", method="node/select", code="-32004"), 1.0
        )
        self.assertIsNone(self.value("nvpair_proxy_rpc_messages_total", method="made/up"))

    def test_sendErrorCounts(self) -> None:
        """An error the proxy generates is answered as before and counted by reason."""
        request = _ChatRequest([b"v1", b"chat", b"completions"])
        # twisted.web's DummyRequest has every part of a request that sendError touches
        answered = cast(IServerRequest, request)
        self.service.context.sendError(answered, ENGINE, 502, "no_owner", "no node advertises it")
        self.assertEqual(request.responseCode, 502)
        self.assertEqual(json.loads(b"".join(request.written))["error"]["code"], "no_owner")
        self.assertEqual(
            self.value("nvpair_proxy_errors_total", engine="llamacpp", reason="no_owner"), 1.0
        )
