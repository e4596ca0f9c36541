"""The ``Host`` rule at the front door, through a real ``ProxyService``'s listener factories.

The service runs on a ``MemoryReactorClock``: its facades' primary and alias factories are
the ones the service hands to ``listenTCP``, fed bytes over in-memory transports from a
loopback peer.  A refused request must leave no trace past the door: no upstream
connection attempted, no exchange, no workload event, no node activity.
"""

from __future__ import annotations

import json
import tempfile

from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.engines import ENGINES
from nvpair.proxy.options import Options
from nvpair.proxy.service import ProxyService
from nvpair.proxy.testing.fakecontext import ListSink
from nvpair.proxy.testing.wire import TCPStringTransport, siteExchange
from nvpair.proxy.testing.wire import splitAnswer as split
from tests.support.fakes.logevents import Events

PORTS = {"ollama": (6100, 6101), "llamacpp": (6200, 6201)}
EVIL = b"evil.example"
CHAT = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "SECRET"}]})

# (engine, method, path, body, extra headers, route class, error shape)
ROUTES: list[tuple[str, bytes, bytes, bytes, bytes, str, str]] = [
    ("ollama", b"POST", b"/api/chat", CHAT.encode(), b"", "inference", "ollama"),
    ("ollama", b"POST", b"/v1/chat/completions", CHAT.encode(), b"", "inference", "openai"),
    ("ollama", b"GET", b"/api/tags", b"", b"", "fleet list", "ollama"),
    ("ollama", b"GET", b"/v1/models", b"", b"", "fleet list", "openai"),
    (
        "ollama",
        b"OPTIONS",
        b"/api/chat",
        b"",
        b"Access-Control-Request-Method: POST\r\n",
        "preflight",
        "ollama",
    ),
    ("ollama", b"DELETE", b"/api/delete", b'{"model": "m1"}', b"", "verbatim", "ollama"),
    ("ollama", b"POST", b"/api/pull", b'{"model": "m1"}', b"", "verbatim", "ollama"),
    ("llamacpp", b"POST", b"/v1/completions", b'{"model": "m1"}', b"", "inference", "openai"),
    ("llamacpp", b"GET", b"/models", b"", b"", "fleet list", "openai"),
    ("llamacpp", b"POST", b"/slots/0?action=save", b'{"filename": "s"}', b"", "verbatim", "openai"),
    ("ollama", b"POST", b"/v1/messages", CHAT.encode(), b"", "inference", "anthropic"),
    ("llamacpp", b"POST", b"/v1/responses", CHAT.encode(), b"", "inference", "openai"),
    (
        "llamacpp",
        b"POST",
        b"/v1/messages/count_tokens",
        CHAT.encode(),
        b"",
        "model-routed",
        "anthropic",
    ),
]


def request(
    method: bytes, path: bytes, host: bytes | None, body: bytes = b"", extra: bytes = b""
) -> bytes:
    """One HTTP/1.1 request as a rebinding page's script would send it."""
    head = b"%s %s HTTP/1.1\r\n" % (method, path)
    if host is not None:
        head += b"Host: %s\r\nOrigin: http://%s\r\n" % (host, host)
    if body:
        head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    return head + extra + b"\r\n" + body


class DoorCase(SynchronousTestCase):
    """A real service with an Ollama and a llama.cpp facade (each on a primary port and an
    alias) on a memory reactor; requests are fed to new loopback connections."""

    def setUp(self) -> None:
        options = Options({})
        options.parseOptions(
            ["--state-dir", tempfile.mkdtemp(prefix="nvpair-door-"), "--max-body", "4096"]
        )
        assert options.settings is not None
        self.reactor = MemoryReactorClock()
        self.service = ProxyService(options.settings, self.reactor)
        self.sink = ListSink()
        self.service.sinks.target = self.sink
        self.events = Events()
        self.service.hosts.log = Logger(observer=self.events)
        for engineId, (port, alias) in PORTS.items():
            self.service.enableFacade(ENGINES[engineId], port, [f"127.0.0.1:{alias}"], True)
            self.service.handlers.handle(
                engineId,
                "discovery:nodes",
                {"nodes": [{"id": "A", "addresses": ["http://10.9.9.9:9"], "models": ["m1"]}]},
            )
            self.service.handlers.handle(
                engineId, "node/set-local-backend", {"url": "http://127.0.0.1:9"}
            )
        self.sink.sent.clear()
        self.factories = {port: factory for port, factory, *_ in self.reactor.tcpServers}

    def exchange(self, port: int, raw: bytes) -> bytes:
        """Feed ``raw`` to a new loopback connection of the listener on ``port``."""
        return siteExchange(self.factories[port], raw)

    def assertNothingPastTheDoor(self) -> None:
        self.assertEqual(self.reactor.tcpClients, [], "no upstream connection attempted")
        self.assertEqual(self.service.context.exchanges, set())
        self.assertEqual(self.sink.sent, [], "no workload event, no node activity")
        self.assertEqual(self.service.context.reporter.live, 0)

    def metric(self, name: str, **labels: str) -> float:
        from prometheus_client import generate_latest

        text = generate_latest(self.service.metrics.registry).decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        raise AssertionError(f"no sample {name} {labels}")


class HostRuleAtTheDoorTests(DoorCase):
    """Every facade route on the primary port and on an alias refuses a foreign ``Host``."""

    def test_everyRouteRefused(self) -> None:
        """Inference, fleet lists, preflights and verbatim routes, primary and alias: 403
        ``host_denied`` in the engine's shape, without CORS headers, before anything else."""
        for engineId, method, path, body, extra, routeClass, shape in ROUTES:
            for port in PORTS[engineId]:
                label = (engineId, port, path, routeClass)
                answer = self.exchange(
                    port, request(method, path, EVIL + b":%d" % port, body, extra)
                )
                status, headers, content = split(answer)
                self.assertEqual(status, 403, label)
                self.assertEqual(headers[b"content-type"], b"application/json", label)
                self.assertFalse([h for h in headers if h.startswith(b"access-control-")])
                self.assertNotIn(b"x-nvpair-node", headers)
                doc = json.loads(content)
                if shape == "ollama":
                    self.assertEqual(doc["reason"], "host_denied", label)
                    self.assertIn("--allowed-hosts", doc["error"])
                elif shape == "anthropic":
                    self.assertEqual(doc["error"]["type"], "permission_error", label)
                    self.assertTrue(doc["error"]["message"].endswith("(host_denied)"), label)
                else:
                    self.assertEqual(
                        (doc["error"]["code"], doc["error"]["type"]),
                        ("host_denied", "proxy_error"),
                        label,
                    )
        self.assertNothingPastTheDoor()
        self.assertEqual(self.metric("nvpair_proxy_host_denied_total", listener="ollama"), 16)
        self.assertEqual(self.metric("nvpair_proxy_host_denied_total", listener="llamacpp"), 10)
        self.assertEqual(self.metric("nvpair_proxy_host_denied_total", listener="lmstudio"), 0)
        self.assertEqual(
            self.metric("nvpair_proxy_errors_total", engine="ollama", reason="host_denied"), 16
        )

    def test_loggedOnceWithoutPathOrBody(self) -> None:
        """One ``warn`` record for the name across routes, ports and facades: no path, no body."""
        for engineId, method, path, body, extra, _, _ in ROUTES:
            for port in PORTS[engineId]:
                self.exchange(port, request(method, path, EVIL + b":%d" % port, body, extra))
        [event] = self.events
        self.assertEqual(
            (event["log_format"], event["log_level"].name, event["host"]),
            ("host-denied", "warn", "evil.example"),
        )
        text = repr(event)
        for secret in ("SECRET", "/api", "/v1", "/slots", "model"):
            self.assertNotIn(secret, text)

    def test_loopbackHostGoesThrough(self) -> None:
        """The same inference request with a loopback ``Host`` is admitted and dispatched."""
        for host in (b"127.0.0.1:6100", b"localhost:6100", b"[::1]:6100"):
            answer = self.exchange(6100, request(b"POST", b"/api/chat", host, CHAT.encode()))
            self.assertNotIn(b" 403 ", answer[:16])
        self.assertEqual(len(self.reactor.tcpClients), 3, "one upstream dial per request")
        submitted = [m for m, _ in self.sink.workloadEvents() if m == "workload:submitted"]
        self.assertGreaterEqual(len(submitted), 3)
        self.assertEqual(self.metric("nvpair_proxy_host_denied_total", listener="ollama"), 0)

    def test_refusedBeforeBodyLimit(self) -> None:
        """A foreign ``Host`` with a body over ``--max-body`` is still 403, and the connection
        closes (the body was not kept)."""
        body = b'{"model": "m1", "x": "' + b"y" * 5000 + b'"}'
        status, headers, content = split(
            self.exchange(6100, request(b"POST", b"/api/chat", EVIL, body))
        )
        self.assertEqual(status, 403)
        self.assertEqual(headers[b"connection"], b"close")
        self.assertEqual(json.loads(content)["reason"], "host_denied")
        self.assertNothingPastTheDoor()

    def test_beforeAdmission(self) -> None:
        """Requests admission would answer itself (400 bad body, 502 ``no_owner``, which is a
        workload) get 403 first: the rule runs before admission, so no workload appears."""
        for body in (b"[]", b'{"model": "nope"}'):
            status, _, content = split(
                self.exchange(6100, request(b"POST", b"/api/chat", EVIL, body))
            )
            self.assertEqual((status, json.loads(content)["reason"]), (403, "host_denied"))
        self.assertNothingPastTheDoor()
        status, _, _ = split(
            self.exchange(6100, request(b"POST", b"/api/chat", b"localhost", b'{"model": "nope"}'))
        )
        self.assertEqual(status, 502)
        self.assertEqual(
            [m for m, _ in self.sink.workloadEvents()], ["workload:submitted", "workload:errored"]
        )

    def test_malformedHostRefused(self) -> None:
        """A ``Host`` that is not ``host[:port]`` is the HTTP layer's 400; one with that syntax
        that no host name has is refused by the rule like a foreign one.  Neither gets past."""
        for host in (b"a b", b"[::1", b"localhost:1:2"):
            status, _, content = split(self.exchange(6101, request(b"GET", b"/api/tags", host)))
            self.assertEqual((status, json.loads(content)["reason"]), (400, "bad_request"), host)
        for host in (b"", b"localhost..", b"127.1", b"127.000.0.1:6101"):
            status, _, content = split(self.exchange(6101, request(b"GET", b"/api/tags", host)))
            self.assertEqual((status, json.loads(content)["reason"]), (403, "host_denied"), host)
        self.assertNothingPastTheDoor()

    def test_allowedHostsOption(self) -> None:
        """A name given with ``--allowed-hosts`` passes the door; ``*`` lets every name in."""
        for argv, host in (
            (["--allowed-hosts", "llm.example"], b"LLM.example:6100"),
            (["--allowed-hosts", "*"], EVIL),
        ):
            options = Options({})
            options.parseOptions(["--state-dir", tempfile.mkdtemp(prefix="nvpair-door-"), *argv])
            assert options.settings is not None
            reactor = MemoryReactorClock()
            service = ProxyService(options.settings, reactor)
            service.sinks.target = ListSink()
            service.enableFacade(ENGINES["ollama"], 6100, [], True)
            [(_, factory, *_)] = reactor.tcpServers
            protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5555))
            assert protocol is not None
            transport = TCPStringTransport()
            protocol.makeConnection(transport)
            protocol.dataReceived(request(b"GET", b"/api/tags", host))
            status, _, content = split(transport.value())
            self.assertEqual((status, json.loads(content)), (200, {"models": []}), argv)
            protocol.connectionLost(Failure(ConnectionDone()))


class HttpRefusalTests(DoorCase):
    """What the HTTP layer refuses before the door is answered in the facade's own shape
    and counted among its generated errors, on the primary port and on an alias."""

    def test_malformedCounted(self) -> None:
        cases = [
            (b"GET /api/tags HTTP/1.1\r\n\r\n", 400),  # no Host
            (b"GET /api/tags HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            (b"GET /api/tags HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n", 400),
            (b"GET /api/tags HTTP/1.1\r\nHost: a\r\nX: " + b"x" * 70000 + b"\r\n\r\n", 431),
        ]
        for engineId, ports in PORTS.items():
            for port in ports:
                for raw, expected in cases:
                    status, _, content = split(self.exchange(port, raw))
                    self.assertEqual(status, expected, (engineId, port, raw[:40]))
                    doc = json.loads(content)
                    if engineId == "ollama":
                        self.assertEqual(doc["reason"], "bad_request")
                    else:
                        self.assertEqual(doc["error"]["code"], "bad_request")
            self.assertEqual(
                self.metric("nvpair_proxy_errors_total", engine=engineId, reason="bad_request"),
                2.0 * len(cases),
            )
        self.assertNothingPastTheDoor()


class ClusterPersonalityTests(SynchronousTestCase):
    """Requests over the cluster personality are not subject to the ``Host`` rule (§8)."""

    def test_peerRequestWithForeignHostForwarded(self) -> None:
        """A pinned peer's request naming any host goes to the local backend, not 403."""
        from types import SimpleNamespace

        from nvpair.proxy.cluster.peer import PeerDoor
        from nvpair.proxy.http.site import FacadeSite
        from nvpair.proxy.testing.fakecontext import FakeContext
        from tests.support.fakes.peertrust import FakeTrust

        context = FakeContext(trust=FakeTrust())
        facade = SimpleNamespace(engine=ENGINES["llamacpp"], localBackend="http://127.0.0.1:9")
        site = FacadeSite(PeerDoor(context, facade), context.clock, 1 << 20, 30.0, 65536)
        channel = site.buildProtocol(IPv4Address("TCP", "10.203.0.2", 40000))
        transport = TCPStringTransport(peerAddress=IPv4Address("TCP", "10.203.0.2", 40000))
        channel.makeConnection(transport)
        channel.dataReceived(request(b"POST", b"/v1/completions", EVIL, b'{"model": "m1"}'))
        self.assertEqual(len(context.upstream.calls), 1)
        self.assertEqual(context.errors, [])
        self.assertEqual(transport.value(), b"")
        channel.connectionLost(Failure(ConnectionDone()))
