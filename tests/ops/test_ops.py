"""Tests for ops.server: /metrics, /status and the page, in memory, and the listener."""

from __future__ import annotations

import json
import tempfile
from typing import Any, cast

from prometheus_client.parser import text_string_to_metric_families
from treq import content
from treq.client import HTTPClient
from treq.testing import RequestTraversalAgent
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort
from twisted.internet.protocol import ServerFactory
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.iweb import IResponse
from twisted.web.resource import IResource
from twisted.web.test.requesthelper import DummyRequest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.broker.channel import RPCError
from nvpair.proxy.engines import ENGINES
from nvpair.proxy.http.client import HTTPClientConnection
from nvpair.proxy.http.interfaces import IServerRequest
from nvpair.proxy.ops.interfaces import IOpsView
from nvpair.proxy.ops.server import OpsListener, opsFactory, opsResource, startOps
from nvpair.proxy.options import Options
from nvpair.proxy.routing.candidates import Snapshot, parseNodes
from nvpair.proxy.routing.reservations import NodeLoad
from nvpair.proxy.service import ProxyService

ENGINE = ENGINES["llamacpp"]
SECRET_PROMPT = "CANARY-ops-prompt"
START = 1_700_000_000.0


def memoryClient(resource: IResource) -> HTTPClient:
    """An in-memory HTTP client of ``resource`` (what ``treq.testing.StubTreq`` builds, typed;
    enough for requests without a body)."""
    return HTTPClient(RequestTraversalAgent(resource))


def makeService(reactor: Any, *argv: str) -> ProxyService:
    """A real, unstarted ``ProxyService`` on ``reactor`` with a throwaway state directory."""
    options = Options(environ={})
    options.parseOptions(["--state-dir", tempfile.mkdtemp(prefix="nvpair-ops-"), *argv])
    assert options.settings is not None
    return ProxyService(options.settings, reactor)


def scripted(service: ProxyService) -> None:
    """Give ``service`` a facade, discovery, scheduler view, activity and two ended workloads."""
    facade = service.enableFacade(ENGINE, 18081, ["127.0.0.1:18082"], True)
    nodes = parseNodes(
        {
            "nodes": [
                {
                    "id": "A",
                    "addresses": ["http://10.0.0.1:8081", "http://10.0.0.2:8081"],
                    "models": ["m1", "m2"],
                },
                {"id": "me", "self": True, "models": ["m1"]},
            ]
        }
    )
    facade.setSnapshot(Snapshot(nodes, ENGINE.normalize))
    facade.confirmed["A"] = "http://10.0.0.2:8081"
    facade.pin = "A"
    facade.setLocalBackend("http://127.0.0.1:8080")
    service.reservations.applyPriority(7, ["A", "me"], {"A": NodeLoad(2, 0.5)})
    service.reservations.reserve("A")
    service.activity.change("A", +1)
    reporter = service.reporter
    reactor = service.reactor
    assert isinstance(reactor, MemoryReactorClock)
    reactor.advance(START - reactor.seconds())
    done = reporter.admit("llamacpp", "m1")
    done.submitted("A")
    done.started("A")
    done.finish("completed", None, {"completionTokens": 3})
    failed = reporter.admit("llamacpp", "m2")
    reactor.advance(2.5)
    failed.finish("failed", "no_owner")
    reporter.admit("llamacpp", "m1")  # still live


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Parse a Prometheus text exposition into {(sample name, label items): value}."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name, frozenset(sample.labels.items())] = sample.value
    return out


class EndpointTestCase(SynchronousTestCase):
    """A scripted service and an in-memory client of its ops resource."""

    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.service = makeService(self.reactor)
        scripted(self.service)
        self.client = memoryClient(opsResource(self.service))

    def get(self, url: str, method: str = "GET") -> tuple[IResponse, bytes]:
        """Request ``url`` in memory; returns the response and its body."""
        response = self.successResultOf(self.client.request(method, url))
        body = self.successResultOf(content(response))
        return response, body


class ViewTests(SynchronousTestCase):
    """The process provides everything the operations listener reads of it."""

    def test_serviceProvidesOpsView(self) -> None:
        """``ProxyService`` provides ``IOpsView`` (attributes and service collection)."""
        self.assertTrue(verifyObject(IOpsView, makeService(MemoryReactorClock())))


class StatusTests(EndpointTestCase):
    """GET /status."""

    def test_facade(self) -> None:
        """Each facade shows its ports, pin, local backend and the scheduler generation."""
        response, body = self.get("http://127.0.0.1:9464/status")
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/json"])
        facade = json.loads(body)["facades"]["llamacpp"]
        self.assertEqual(facade["port"], 18081)
        self.assertEqual(facade["aliases"], ["127.0.0.1:18082"])
        self.assertEqual(facade["pin"], "A")
        self.assertEqual(facade["localBackend"], "http://127.0.0.1:8080")
        self.assertEqual(facade["schedulerGeneration"], 7)
        self.assertEqual(facade["discoveryUpdates"], 1)

    def test_discovery(self) -> None:
        """Nodes show model counts, addresses, the confirmed address, activity and load."""
        _, body = self.get("http://127.0.0.1/status")
        nodes = {n["id"]: n for n in json.loads(body)["facades"]["llamacpp"]["nodes"]}
        self.assertEqual(set(nodes), {"A", "me"})
        a = nodes["A"]
        self.assertEqual(a["models"], 2)
        self.assertFalse(a["self"])
        self.assertEqual(a["addresses"], ["http://10.0.0.1:8081", "http://10.0.0.2:8081"])
        self.assertEqual(a["confirmed"], "http://10.0.0.2:8081")
        self.assertEqual((a["inFlight"], a["reserved"]), (1, 1))
        self.assertEqual(a["estimatedLoad"], 3.5)
        me = nodes["me"]
        self.assertTrue(me["self"])
        self.assertEqual((me["models"], me["confirmed"], me["estimatedLoad"]), (1, None, 0.0))

    def test_scheduler(self) -> None:
        """The process-wide scheduler view: generation, order and estimated load per node."""
        _, body = self.get("http://127.0.0.1/status")
        doc = json.loads(body)
        self.assertEqual(
            doc["scheduler"],
            {"generation": 7, "order": ["A", "me"], "estimatedLoad": {"A": 3.5, "me": 0.0}},
        )
        self.assertEqual(doc["inFlight"], {"A": 1})
        self.assertEqual(doc["reservations"], {"A": 1})
        self.assertEqual(doc["runId"], self.service.reporter.runId)

    def test_workloads(self) -> None:
        """The last workloads, newest first, with ids, model, state, node, attempts and stats."""
        _, body = self.get("http://127.0.0.1/status")
        workloads = json.loads(body)["workloads"]
        self.assertEqual(workloads["live"], 1)
        self.assertEqual(workloads["terminals"], {"completed": 1, "failed": 1})
        first, second = workloads["recent"]
        self.assertEqual(
            first,
            {
                "id": "2",
                "engine": "llamacpp",
                "model": "m2",
                "state": "failed",
                "node": None,
                "attempts": 0,
                "error": "no_owner",
                "stats": None,
                "createdAt": 1_700_000_000_000,
                "completedAt": 1_700_000_002_500,
                "durationMs": 2500,
                "errorText": "no node serves this model",
            },
        )
        self.assertEqual(second["id"], "1")
        self.assertEqual(
            (second["state"], second["node"], second["attempts"]), ("completed", "A", 1)
        )
        self.assertEqual(second["stats"], {"completionTokens": 3})

    def test_recentIsBounded(self) -> None:
        """Only the last 50 workloads are listed."""
        for _ in range(60):
            self.service.reporter.admit("llamacpp", "m1").finish("completed")
        _, body = self.get("http://127.0.0.1/status")
        recent = json.loads(body)["workloads"]["recent"]
        self.assertEqual(len(recent), 50)
        self.assertEqual(recent[0]["id"], "63")

    def test_onlyListedFields(self) -> None:
        """A workload entry carries only its listed fields, whatever the history holds."""
        self.service.reporter.recent.append({"id": "x", "prompt": SECRET_PROMPT})
        _, body = self.get("http://127.0.0.1/status")
        self.assertNotIn(SECRET_PROMPT.encode(), body)

    def test_noFacades(self) -> None:
        """A service with nothing enabled answers an empty but well-formed document."""
        client = memoryClient(opsResource(makeService(MemoryReactorClock())))
        response = self.successResultOf(client.get("http://127.0.0.1/status"))
        doc = self.successResultOf(response.json())
        self.assertEqual(doc["facades"], {})
        self.assertEqual(doc["scheduler"], {"generation": None, "order": [], "estimatedLoad": {}})
        self.assertEqual(doc["workloads"]["recent"], [])


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
        self.service.activity.change("A", -1)
        self.service.activity.change("me", +2)
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


class PageTests(EndpointTestCase):
    """What the listener refuses (the page itself: tests/ops/test_opspage.py)."""

    def test_unknownPath(self) -> None:
        """Other paths are 404."""
        response, _ = self.get("http://127.0.0.1/nope")
        self.assertEqual(response.code, 404)

    def test_methodNotAllowed(self) -> None:
        """The endpoints are read-only: POST is refused."""
        response, _ = self.get("http://127.0.0.1/status", "POST")
        self.assertEqual(response.code, 405)

    def test_foreignHost(self) -> None:
        """A request naming a non-loopback host (DNS rebinding) gets 403 and no data."""
        for url in (
            "http://evil.example:9464/status",
            "http://10.0.0.1:9464/metrics",
            "http://localhost.evil.example/",
            "http://evil.example/status/history",
            "http://evil.example/ops.js",
        ):
            response, body = self.get(url)
            self.assertEqual(response.code, 403, url)
            self.assertNotIn(self.service.reporter.runId.encode(), body)
            self.assertNotIn(b"nvpair_proxy", body)

    def test_sharedHostRule(self) -> None:
        """The ops listener applies the facades' Host rule: same names, --allowed-hosts, count."""
        for url in (
            "http://127.0.0.1:9464/status",
            "http://api.localhost/status",
            "http://box.internal/status",
        ):
            self.assertEqual(self.get(url)[0].code, 200, url)
        self.assertEqual(self.get("http://proxy.example/status")[0].code, 403)
        metrics = samples(self.get("http://localhost/metrics")[1].decode())
        self.assertEqual(
            metrics["nvpair_proxy_host_denied_total", frozenset({("listener", "ops")})], 1.0
        )
        service = makeService(MemoryReactorClock(), "--allowed-hosts", "proxy.example")
        client = memoryClient(opsResource(service))
        response = self.successResultOf(client.get("http://proxy.example/status"))
        self.assertEqual(response.code, 200)


class PeerTests(SynchronousTestCase):
    """The ops factory serves loopback peers only, like the facades' alias listeners."""

    REQUEST = b"GET /status HTTP/1.1\r\nHost: 127.0.0.1:9464\r\n\r\n"

    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.service = makeService(self.reactor)
        self.factory = opsFactory(self.service)
        self.factory.doStart()
        self.addCleanup(self.factory.doStop)

    def connect(self, address: Any, data: bytes) -> StringTransport:
        protocol = self.factory.buildProtocol(address)
        assert protocol is not None
        transport = StringTransport(peerAddress=address)
        protocol.makeConnection(transport)
        protocol.dataReceived(data)
        return transport

    def test_nonLoopbackRefused(self) -> None:
        """A non-loopback peer is closed without an HTTP answer."""
        for address in (
            IPv4Address("TCP", "192.0.2.7", 40000),
            IPv6Address("TCP", "2001:db8::1", 40000),
            IPv6Address("TCP", "::ffff:192.0.2.7", 40000),
        ):
            transport = self.connect(address, self.REQUEST)
            self.assertEqual(transport.value(), b"", address)
            self.assertTrue(transport.disconnecting, address)

    def test_loopbackServed(self) -> None:
        """A loopback peer gets the status document."""
        transport = self.connect(IPv4Address("TCP", "127.0.0.1", 40000), self.REQUEST)
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 200 "))
        self.assertIn(self.service.reporter.runId.encode(), transport.value())

    def test_tlsRefused(self) -> None:
        """A TLS hello, even from loopback, is closed: the ops port speaks plaintext only."""
        transport = self.connect(IPv4Address("TCP", "127.0.0.1", 40000), b"\x16\x03\x01\x00")
        self.assertEqual(transport.value(), b"")
        self.assertTrue(transport.disconnecting)


@implementer(IListeningPort)
class _Port:
    """A listening port that records being stopped."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stopped = False

    def startListening(self) -> None:
        """Already listening: the reactor made it so."""

    def getHost(self) -> IPv4Address:
        return IPv4Address("TCP", "127.0.0.1", self.port)

    def stopListening(self) -> None:
        self.stopped = True


class _Reactor(MemoryReactorClock):
    """A memory reactor whose ports record stopListening, and that can refuse one port."""

    def __init__(self, busy: int | None = None) -> None:
        super().__init__()
        self.busy = busy
        self.ports: dict[int, tuple[_Port, str]] = {}

    def listenTCP(
        self, port: int, factory: ServerFactory, backlog: int = 50, interface: str = ""
    ) -> _Port:
        if port == self.busy:
            raise CannotListenError(interface, port, OSError(98, "Address already in use"))
        super().listenTCP(port, factory, backlog, interface)
        listening = _Port(port)
        self.ports[port] = (listening, interface)
        return listening


class ListenerTests(SynchronousTestCase):
    """The ops listener's life follows the service's."""

    def test_standaloneHasNoListener(self) -> None:
        """In standalone mode the workload and activity sinks say nobody listens."""
        service = makeService(_Reactor(), "--standalone", "--engines", "ollama")
        service.startService()
        self.assertFalse(getattr(service.reporter.sink, "listening"))  # noqa: B009
        self.assertFalse(getattr(service.activity._sink, "listening"))  # noqa: B009
        self.successResultOf(service.stopService())

    def test_startsAndStopsWithService(self) -> None:
        """--ops-port makes startService listen on 127.0.0.1 only; stopService closes it."""
        reactor = _Reactor()
        service = makeService(reactor, "--standalone", "--engines", "ollama", "--ops-port", "19464")
        service.startService()
        listening, interface = reactor.ports[19464]
        self.assertEqual(interface, "127.0.0.1")
        self.assertTrue(verifyObject(IListeningPort, listening))
        self.assertIsInstance(service.getServiceNamed("ops"), OpsListener)
        self.assertFalse(listening.stopped)
        self.successResultOf(service.stopService())
        self.assertTrue(listening.stopped)

    def test_standaloneDefault(self) -> None:
        """Standalone mode serves ops on the documented default port 9464."""
        reactor = _Reactor()
        service = makeService(reactor, "--standalone", "--engines", "ollama")
        service.startService()
        self.addCleanup(service.stopService)
        self.assertEqual(reactor.ports[9464][1], "127.0.0.1")

    def test_offWhenZero(self) -> None:
        """--ops-port 0 turns the listener off."""
        reactor = _Reactor()
        service = makeService(reactor, "--standalone", "--engines", "ollama", "--ops-port", "0")
        service.startService()
        self.addCleanup(service.stopService)
        self.assertNotIn(9464, reactor.ports)
        self.assertNotIn("ops", [s.name for s in service])

    def test_bindFailureIsNotFatal(self) -> None:
        """A busy ops port is logged; the listener stays down and stops cleanly."""
        reactor = _Reactor(busy=19465)
        service = makeService(reactor)
        listener = startOps(service, 19465)
        listener.startService()
        self.assertIsNone(listener.listening)
        self.assertEqual(self.flushLoggedErrors(), [])
        self.successResultOf(listener.stopService())


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
