"""The listener personalities (spec §7, protocol §8): first-byte switch and loopback gate."""

from __future__ import annotations

from typing import Any

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.interfaces import ITCPTransport
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nvpair.proxy.facade.listener import PersonalityFactory, isLoopback
from nvpair.proxy.testing.wire import TCPStringTransport


class Recorder(Protocol):
    """An inner protocol that records what reaches it."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.data = b""
        self.lost: Failure | None = None

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.lost = reason


class RecordingFactory(Factory):
    """The plaintext factory stand-in: records the protocols it built and start/stop."""

    def __init__(self) -> None:
        self.built: list[Recorder] = []
        self.started = 0
        self.stopped = 0

    def startFactory(self) -> None:
        self.started += 1

    def stopFactory(self) -> None:
        self.stopped += 1

    def buildProtocol(self, addr: Any) -> Recorder:
        p = Recorder("plain")
        self.built.append(p)
        return p


class Transport(TCPStringTransport):
    """A TCP ``StringTransport`` that says whether it was aborted."""

    disconnected = False


def v4(host: str) -> IPv4Address:
    return IPv4Address("TCP", host, 40000)


def v6(host: str) -> IPv6Address:
    return IPv6Address("TCP", host, 40000)


class LoopbackTests(SynchronousTestCase):
    """``isLoopback`` accepts 127.0.0.0/8, ::1 and v4-mapped loopback only."""

    def test_loopback(self) -> None:
        """Loopback peers in every spelling are recognised."""
        for addr in (
            v4("127.0.0.1"),
            v4("127.1.2.3"),
            v6("::1"),
            v6("::ffff:127.0.0.1"),
            v6("::ffff:127.9.9.9"),
        ):
            self.assertTrue(isLoopback(addr), addr)

    def test_notLoopback(self) -> None:
        """LAN, unspecified, mapped non-loopback and odd addresses are not loopback."""
        for addr in (
            v4("192.168.1.5"),
            v4("10.0.0.1"),
            v4("0.0.0.0"),
            v6("::ffff:10.0.0.1"),
            v6("fe80::1"),
            v6("::"),
            v4("localhost"),
            v4(""),
        ):
            self.assertFalse(isLoopback(addr), addr)

    def test_noHost(self) -> None:
        """An address without a host (a UNIX socket) is not loopback."""
        self.assertFalse(isLoopback(object()))  # type: ignore[arg-type]


class SwitchTests(SynchronousTestCase):
    """Connections through a ``PersonalityFactory`` on a ``Clock``."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.plain = RecordingFactory()
        self.tlsBuilt: list[Recorder] = []
        self.factory = self.make()

    def make(self, tls: bool = True, **kwargs: Any) -> PersonalityFactory:
        def buildTLS(addr: Any) -> Recorder:
            p = Recorder("tls")
            self.tlsBuilt.append(p)
            return p

        return PersonalityFactory(self.clock, self.plain, buildTLS if tls else None, **kwargs)

    def connect(
        self, addr: Any, factory: PersonalityFactory | None = None
    ) -> tuple[Any, Transport]:
        factory = factory or self.factory
        proto = factory.buildProtocol(addr)
        transport = Transport(peerAddress=addr)
        if proto is not None:
            proto.makeConnection(transport)
        return proto, transport

    def test_plaintextLoopback(self) -> None:
        """A loopback plaintext connection reaches the plaintext factory with its first bytes."""
        proto, transport = self.connect(v4("127.0.0.1"))
        proto.dataReceived(b"GET / HTTP/1.1\r\n")
        proto.dataReceived(b"\r\n")
        self.assertEqual(len(self.plain.built), 1)
        self.assertEqual(self.plain.built[0].data, b"GET / HTTP/1.1\r\n\r\n")
        self.assertIs(self.plain.built[0].transport, transport)
        self.assertFalse(transport.disconnected)
        self.assertTrue(transport.noDelay, "answers are never held for an ACK")
        self.assertTrue(verifyObject(ITCPTransport, transport))

    def test_plaintextMappedLoopback(self) -> None:
        """A v4-mapped loopback peer on a dual-stack socket is served plaintext."""
        proto, transport = self.connect(v6("::ffff:127.0.0.1"))
        proto.dataReceived(b"G")
        self.assertEqual(len(self.plain.built), 1)

    def test_plaintextRemoteClosed(self) -> None:
        """A plaintext connection from a LAN address is closed without an answer."""
        proto, transport = self.connect(v4("192.168.1.20"))
        proto.dataReceived(b"GET / HTTP/1.1\r\n\r\n")
        self.assertTrue(transport.disconnected)
        self.assertEqual(transport.value(), b"")
        self.assertEqual(self.plain.built, [])

    def test_tls(self) -> None:
        """A first byte 0x16 goes to the TLS personality, from any address."""
        proto, transport = self.connect(v4("192.168.1.20"))
        proto.dataReceived(b"\x16\x03\x01rest")
        self.assertEqual(len(self.tlsBuilt), 1)
        self.assertEqual(self.tlsBuilt[0].data, b"\x16\x03\x01rest")
        self.assertEqual(self.plain.built, [])

    def test_tlsWithoutPersonality(self) -> None:
        """A TLS byte is closed when there is no TLS personality (not a member)."""
        factory = self.make(tls=False)
        proto, transport = self.connect(v4("127.0.0.1"), factory)
        proto.dataReceived(b"\x16\x03\x01")
        self.assertTrue(transport.disconnected)
        self.assertEqual(transport.value(), b"")

    def test_tlsRefusedByPersonality(self) -> None:
        """A TLS personality that declines (returns None) closes the connection."""
        factory = PersonalityFactory(self.clock, self.plain, lambda addr: None)
        proto, transport = self.connect(v4("10.0.0.2"), factory)
        proto.dataReceived(b"\x16")
        self.assertTrue(transport.disconnected)

    def test_aliasLoopbackOnly(self) -> None:
        """An alias listener refuses TLS even with a TLS personality, and serves plaintext."""
        factory = self.make(loopbackOnly=True)
        proto, transport = self.connect(v4("127.0.0.1"), factory)
        proto.dataReceived(b"\x16")
        self.assertTrue(transport.disconnected)
        self.assertEqual(self.tlsBuilt, [])
        proto, transport = self.connect(v4("127.0.0.1"), factory)
        proto.dataReceived(b"GET")
        self.assertEqual(len(self.plain.built), 1)

    def test_connectionLostForwarded(self) -> None:
        """Losing the connection reaches the inner protocol and frees the slot."""
        proto, _ = self.connect(v4("127.0.0.1"))
        proto.dataReceived(b"G")
        self.assertEqual(self.factory.connections, 1)
        proto.connectionLost(Failure(ConnectionError()))
        self.assertIsNotNone(self.plain.built[0].lost)
        self.assertEqual(self.factory.connections, 0)

    def test_connectionLimit(self) -> None:
        """Beyond ``maxConnections`` new connections are refused until one closes."""
        factory = self.make(maxConnections=2)
        p1, _ = self.connect(v4("127.0.0.1"), factory)
        p2, _ = self.connect(v4("127.0.0.1"), factory)
        self.assertIsNone(factory.buildProtocol(v4("127.0.0.1")))
        self.assertEqual(factory.refused, 1)
        p1.connectionLost(Failure(ConnectionError()))
        self.assertIsNotNone(factory.buildProtocol(v4("127.0.0.1")))

    def test_silentConnectionDropped(self) -> None:
        """A connection that sends nothing within the first-byte timeout is aborted."""
        factory = self.make(firstByteTimeout=30.0)
        proto, transport = self.connect(v4("127.0.0.1"), factory)
        self.clock.advance(29)
        self.assertFalse(transport.disconnected)
        self.clock.advance(1)
        self.assertTrue(transport.disconnected)
        proto.connectionLost(Failure(ConnectionError()))
        self.assertEqual(factory.connections, 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_firstByteCancelsTimer(self) -> None:
        """Once the first byte arrives the silent-connection timer is gone."""
        factory = self.make(firstByteTimeout=30.0)
        proto, transport = self.connect(v4("127.0.0.1"), factory)
        proto.dataReceived(b"G")
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(100)
        self.assertFalse(transport.disconnected)

    def test_closedBeforeFirstByte(self) -> None:
        """A connection that closes silently leaves no timer behind."""
        proto, _ = self.connect(v4("127.0.0.1"))
        proto.connectionLost(Failure(ConnectionError()))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_noTimeout(self) -> None:
        """A zero first-byte timeout arms no timer."""
        factory = self.make(firstByteTimeout=0)
        self.connect(v4("127.0.0.1"), factory)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_factoryStartStop(self) -> None:
        """Starting and stopping the personality factory starts and stops the site."""
        self.factory.doStart()
        self.factory.doStop()
        self.assertEqual((self.plain.started, self.plain.stopped), (1, 1))
