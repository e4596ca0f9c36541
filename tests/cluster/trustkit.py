"""Shared fixtures for the cluster membership tests (nvpair.proxy.cluster.membership).

Node certificates minted once per run, an in-memory TLS connection between two creators, a
temporary cluster directory with write helpers, a mixin building polled ``ClusterTrust``
objects on a fake clock, and the odd creators and observers the handshake tests need.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from OpenSSL import SSL, crypto
from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import (
    IOpenSSLClientConnectionCreator,
    IOpenSSLServerConnectionCreator,
)
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, LogEvent
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol
from twisted.python.failure import Failure
from twisted.test.iosim import connectedServerAndClient
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from nvpair.proxy.cluster.files import fingerprintOf
from nvpair.proxy.cluster.membership import ClusterTrust
from nvpair.proxy.testing.certs import makeNodeCert, writeFileAtomic

# Certificates are expensive enough to mint once per test run.
A_CERT, A_KEY, A_FP = makeNodeCert("node-a")
B_CERT, B_KEY, B_FP = makeNodeCert("node-b")
C_CERT, C_KEY, C_FP = makeNodeCert("node-c")


class Recorder(Protocol):
    """An application protocol that records what it receives and how it ended."""

    def __init__(self) -> None:
        self.received = b""
        self.lost: Failure | None = None

    def dataReceived(self, data: bytes) -> None:
        """Record application bytes."""
        self.received += data

    def connectionLost(self, reason: Failure | None = None) -> None:
        """Record the end of the connection."""
        self.lost = reason


class Connection:
    """One in-memory TLS connection between a server creator and a client creator."""

    def __init__(
        self,
        serverCreator: IOpenSSLServerConnectionCreator,
        clientCreator: IOpenSSLClientConnectionCreator,
    ) -> None:
        self.clock = Clock()
        serverFactory = TLSMemoryBIOFactory(
            serverCreator, False, Factory.forProtocol(Recorder), self.clock
        )
        clientFactory = TLSMemoryBIOFactory(
            clientCreator, True, Factory.forProtocol(Recorder), self.clock
        )
        self.serverTLS: TLSMemoryBIOProtocol = serverFactory.buildProtocol(
            IPv4Address("TCP", "192.0.2.2", 40000)
        )
        self.clientTLS: TLSMemoryBIOProtocol = clientFactory.buildProtocol(
            IPv4Address("TCP", "192.0.2.1", 11435)
        )
        server, client = self.serverTLS.wrappedProtocol, self.clientTLS.wrappedProtocol
        assert isinstance(server, Recorder) and isinstance(client, Recorder)
        self.server, self.client = server, client
        _, _, self.pump = connectedServerAndClient(
            lambda: self.serverTLS, lambda: self.clientTLS, clock=self.clock
        )
        self.pump.flush()

    def exchange(self) -> bool:
        """Send a message each way; return whether both arrived and nothing was lost."""
        self.clientTLS.write(b"ping")
        self.pump.flush()
        self.serverTLS.write(b"pong")
        self.pump.flush()
        return (
            self.server.received == b"ping"
            and self.client.received == b"pong"
            and self.server.lost is None
            and self.client.lost is None
        )

    def assertRefused(self, case: SynchronousTestCase, serverReason: str) -> None:
        """Assert that no byte crossed and the handshake failed, the server citing a reason."""
        self.clientTLS.write(b"ping")
        self.pump.flush()
        self.serverTLS.write(b"pong")
        self.pump.flush()
        case.assertEqual(self.server.received, b"")
        case.assertEqual(self.client.received, b"")
        case.assertIsNotNone(self.server.lost)
        case.assertIsNotNone(self.client.lost)
        assert self.client.lost is not None
        case.assertTrue(self.client.lost.check(SSL.Error))
        assert self.server.lost is not None
        case.assertTrue(self.server.lost.check(SSL.Error))
        case.assertIn(serverReason, str(self.server.lost.value))

    def close(self) -> None:
        """Close the connection cleanly and drain the pump."""
        self.clientTLS.loseConnection()
        self.pump.flush()


class Dir:
    """A cluster directory under a test's temporary path, with write helpers."""

    def __init__(self, case: SynchronousTestCase) -> None:
        self.path = os.path.abspath(case.mktemp())
        os.makedirs(self.path)

    def file(self, name: str) -> str:
        """Absolute path of a file in the directory."""
        return os.path.join(self.path, name)

    def write(self, name: str, data: bytes) -> None:
        """Atomically write raw bytes to a file in the directory."""
        writeFileAtomic(self.file(name), data)

    def writeInPlace(self, name: str, data: bytes) -> None:
        """Overwrite a file in place, as a non-atomic writer would (a half-written file)."""
        with open(self.file(name), "wb") as f:
            f.write(data)

    def remove(self, name: str) -> None:
        """Remove a file from the directory."""
        os.remove(self.file(name))


class TrustMixin:
    """Builds ClusterTrust objects with a fake clock and a problem recorder."""

    def makeTrust(
        self, path: str | None, interval: float = 1.0, racyWindow: float = 2.0
    ) -> ClusterTrust:
        """Return a started ClusterTrust whose problems land in ``self.problems``."""
        case = self
        assert isinstance(case, SynchronousTestCase)
        self.clock = Clock()
        self.problems: list[str] = []
        trust = ClusterTrust(path, self.clock, self.problems.append, interval, racyWindow)
        trust.start()
        case.addCleanup(trust.stop)
        return trust


class NoPeer:
    """A transport-like object whose peer certificate is absent."""

    def getPeerCertificate(self) -> None:
        """No certificate."""
        return None


@implementer(ILogObserver)
class Events(list[LogEvent]):
    """A log observer keeping every event."""

    def __call__(self, event: LogEvent) -> None:
        self.append(event)


def verifyPinned(fp: str) -> Callable[[SSL.Connection, crypto.X509, int, int, int], bool]:
    """A verify callback accepting only the leaf with fingerprint ``fp``."""

    def verify(conn: SSL.Connection, cert: crypto.X509, errnum: int, depth: int, ok: int) -> bool:
        if depth > 0:
            return True
        der = cert.to_cryptography().public_bytes(serialization.Encoding.DER)
        return fingerprintOf(der) == fp

    return verify


@implementer(IOpenSSLClientConnectionCreator)
class NoCertClient:
    """A client creator that presents no certificate but checks the server's pin."""

    def __init__(self, serverFP: str) -> None:
        self._ctx = SSL.Context(SSL.TLS_METHOD)
        self._ctx.set_verify(SSL.VERIFY_PEER, verifyPinned(serverFP))

    def clientConnectionForTLS(self, tlsProtocol: TLSMemoryBIOProtocol) -> SSL.Connection:
        """A fresh client connection."""
        return SSL.Connection(self._ctx, None)


@implementer(IOpenSSLServerConnectionCreator)
class PlainServer:
    """A server creator with node a's certificate that asks for no client certificate."""

    def __init__(self) -> None:
        self._ctx = SSL.Context(SSL.TLS_METHOD)
        self._ctx.use_certificate(x509.load_pem_x509_certificate(A_CERT))
        self._ctx.use_privatekey(
            serialization.load_pem_private_key(A_KEY, password=None)  # type: ignore[arg-type]
        )

    def serverConnectionForTLS(self, tlsProtocol: TLSMemoryBIOProtocol) -> SSL.Connection:
        """A fresh server connection."""
        return SSL.Connection(self._ctx, None)
