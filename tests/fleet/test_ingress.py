"""The first-byte switch of the real listener (protocol §8): a TLS first byte refused without a
cluster directory, plaintext from this host's non-loopback address closed without an answer.

``test_netns`` checks the same gate with a caller in a network namespace of its own.
"""

from __future__ import annotations

import socket

from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.trial.unittest import SkipTest, TestCase

from tests.support.harness import ProxyFixture


class _Raw(Protocol):
    """Sends bytes on connect and records what comes back until the connection closes."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.received = b""
        self.closed: defer.Deferred[None] = defer.Deferred()

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(self.payload)

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.closed.callback(None)


def lanAddress() -> str | None:
    """This host's non-loopback IPv4 address, if it has one (no packet is sent)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))
        host = str(s.getsockname()[0])
    except OSError:
        return None
    finally:
        s.close()
    return None if host.startswith("127.") or host == "0.0.0.0" else host


class IngressTests(TestCase):
    """The first-byte switch of the real listener (protocol §8)."""

    timeout = 60

    async def rawExchange(self, host: str, port: int, payload: bytes) -> bytes:
        proto = _Raw(payload)
        endpoint = TCP4ClientEndpoint(reactor, host, port, timeout=10)
        await connectProtocol(endpoint, proto)
        await proto.closed.addTimeout(30, reactor)
        return proto.received

    async def test_tlsRefusedWhenNotMember(self) -> None:
        """Without a cluster directory a TLS first byte is closed without an answer."""
        proxy = ProxyFixture(self, reactor)
        await proxy.start()
        port = await proxy.enable("ollama")
        hello = b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00"
        self.assertEqual(await self.rawExchange("127.0.0.1", port, hello), b"")
        answer = await self.rawExchange(
            "127.0.0.1",
            port,
            b"GET /api/tags HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        )
        self.assertTrue(answer.startswith(b"HTTP/1.1 200 "), answer[:40])

    async def test_plaintextFromLanClosed(self) -> None:
        """A plaintext connection from a non-loopback address is closed without an answer."""
        host = lanAddress()
        if host is None:
            raise SkipTest("no non-loopback IPv4 address on this host")
        proxy = ProxyFixture(self, reactor)
        await proxy.start()
        port = await proxy.enable("llamacpp")
        answer = await self.rawExchange(host, port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(answer, b"")
