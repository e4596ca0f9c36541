"""The ops listener itself (spec §13): what it refuses (paths, methods, foreign hosts,
non-loopback peers, TLS) and its life with the service (port, default, off, bind failure)."""

from __future__ import annotations

import socket
from typing import Any

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort
from twisted.internet.protocol import ServerFactory
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.ops.server import OpsListener, opsFactory, opsResource, startOps
from nvpair.proxy.testing.wire import TCPStringTransport
from tests.ops.opskit import EndpointTestCase, makeService, memoryClient, samples


class PageTests(EndpointTestCase):
    """What the listener refuses (the page itself: tests/ops/test_opspage.py; in a browser:
    tests/browser/)."""

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
            self.assertNotIn(self.service.context.reporter.runId.encode(), body)
            self.assertNotIn(b"nvpair_proxy", body)

    def test_sharedHostRule(self) -> None:
        """The ops listener applies the facades' Host rule: same names, --allowed-hosts, count."""
        for url in (
            "http://127.0.0.1:9464/status",
            "http://api.localhost/status",
            f"http://{socket.gethostname().split('.')[0]}.internal/status",  # its own name
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

    def connect(self, address: Any, data: bytes) -> TCPStringTransport:
        protocol = self.factory.buildProtocol(address)
        assert protocol is not None
        transport = TCPStringTransport(peerAddress=address)
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
        self.assertIn(self.service.context.reporter.runId.encode(), transport.value())

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
        self.assertFalse(getattr(service.context.reporter.sink, "listening"))  # noqa: B009
        self.assertFalse(getattr(service.context.activity._sink, "listening"))  # noqa: B009
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
