"""Pinned mutual TLS between ClusterTrust objects: in-memory handshakes accepted and refused.

Pins, membership and certificate rotation taking effect on the next connection, peer node ids,
the change log record and the per-generation context cache (nvpair.proxy.cluster.membership).
"""

from __future__ import annotations

from twisted.internet.interfaces import (
    IOpenSSLClientConnectionCreator,
    IOpenSSLServerConnectionCreator,
)
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface.verify import verifyObject

from nvpair.proxy.cluster.membership import ClusterTrust
from nvpair.proxy.cluster.tls import NoPin
from nvpair.proxy.testing.certs import writeClusterDir, writeMember, writeNodeTLS, writePins
from tests.cluster.trustkit import (
    A_CERT,
    A_FP,
    A_KEY,
    B_CERT,
    B_FP,
    B_KEY,
    C_CERT,
    C_FP,
    C_KEY,
    Connection,
    Dir,
    Events,
    NoCertClient,
    NoPeer,
    PlainServer,
)


class HandshakeTests(SynchronousTestCase):
    """In-memory mutual-TLS handshakes between two ClusterTrust objects."""

    def setUp(self) -> None:
        """Node a (server) pins b; node b (client) pins a; node c is pinned by nobody."""
        self.problems: list[str] = []
        self.aDir = Dir(self)
        self.bDir = Dir(self)
        self.cDir = Dir(self)
        writeClusterDir(self.aDir.path, "a", A_CERT, A_KEY, {"b": B_FP})
        writeClusterDir(self.bDir.path, "b", B_CERT, B_KEY, {"a": A_FP, "c": C_FP})
        writeClusterDir(self.cDir.path, "c", C_CERT, C_KEY, {"a": A_FP})
        self.a = self.trust(self.aDir.path)
        self.b = self.trust(self.bDir.path)
        self.c = self.trust(self.cDir.path)

    def trust(self, path: str) -> ClusterTrust:
        """A loaded trust for a directory (no polling)."""
        trust = ClusterTrust(path, Clock(), self.problems.append)
        trust.reload()
        return trust

    def test_interfaces(self) -> None:
        """The creators provide the OpenSSL connection creator interfaces."""
        self.assertTrue(IOpenSSLServerConnectionCreator.providedBy(self.a.serverContextFactory))
        self.assertTrue(IOpenSSLClientConnectionCreator.providedBy(self.b.clientCreatorFor("a")))
        self.assertTrue(IPolicyForHTTPS.providedBy(self.b.policyForNode("a")))
        self.assertRaises(NoPin, self.b.policyForNode, "z")

    def test_pinnedClientAccepted(self) -> None:
        """A pinned client reaching the server it pinned exchanges data both ways."""
        conn = Connection(self.a.serverContextFactory, self.b.clientCreatorFor("a"))
        self.assertTrue(conn.exchange())
        self.assertEqual(self.a.peerNodeId(conn.serverTLS), "b")
        self.assertEqual(self.b.peerNodeId(conn.clientTLS), "a")
        conn.close()
        self.assertEqual(self.problems, [])

    def test_policyCreator(self) -> None:
        """The node policy's creator ignores the netloc and completes the handshake."""
        creator = self.b.policyForNode("a").creatorForNetloc(b"10.0.0.9", 11435)
        conn = Connection(self.a.serverContextFactory, creator)
        self.assertTrue(conn.exchange())
        conn.close()

    def test_unpinnedClientRefused(self) -> None:
        """A client whose certificate is not pinned by the server is refused."""
        conn = Connection(self.a.serverContextFactory, self.c.clientCreatorFor("a"))
        conn.assertRefused(self, "certificate verify failed")
        self.assertIsNone(self.a.peerNodeId(conn.serverTLS))

    def test_noClientCertificateRefused(self) -> None:
        """A client presenting no certificate is refused."""
        creator = NoCertClient(A_FP)
        conn = Connection(self.a.serverContextFactory, creator)
        conn.assertRefused(self, "peer did not return a certificate")

    def test_sanityNoCertClientWorksAgainstPlainServer(self) -> None:
        """The certificate-less test client can complete a handshake when none is required."""
        server, client = PlainServer(), NoCertClient(A_FP)
        self.assertTrue(verifyObject(IOpenSSLServerConnectionCreator, server))
        self.assertTrue(verifyObject(IOpenSSLClientConnectionCreator, client))
        conn = Connection(server, client)
        self.assertTrue(conn.exchange())
        conn.close()

    def test_clientRefusesWrongServer(self) -> None:
        """A client expecting node c refuses node a's server, though a would accept it."""
        conn = Connection(self.a.serverContextFactory, self.b.clientCreatorFor("c"))
        conn.assertRefused(self, "alert unknown ca")

    def test_nonMemberServerRefuses(self) -> None:
        """A server that is not a member refuses even a pinned client."""
        self.aDir.remove("member.json")
        self.a.reload()
        self.assertFalse(self.a.isMember)
        conn = Connection(self.a.serverContextFactory, self.b.clientCreatorFor("a"))
        conn.assertRefused(self, "no shared cipher")

    def test_serverWithoutCredentialsRefuses(self) -> None:
        """A member with no certificate yet refuses every connection."""
        d = Dir(self)
        writeMember(d.path, "a")
        writePins(d.path, {"b": B_FP})
        server = self.trust(d.path)
        conn = Connection(server.serverContextFactory, self.b.clientCreatorFor("a"))
        conn.assertRefused(self, "no shared cipher")

    def test_clientCreatorAfterLeavingRefuses(self) -> None:
        """A creator obtained before the client left the cluster fails its next handshake."""
        creator = self.b.clientCreatorFor("a")
        self.bDir.remove("member.json")
        self.b.reload()
        conn = Connection(self.a.serverContextFactory, creator)
        conn.assertRefused(self, "alert unknown ca")

    def test_clientCreatorAfterPinRemovedRefuses(self) -> None:
        """A creator obtained before the server's pin was removed fails its next handshake."""
        creator = self.b.clientCreatorFor("a")
        writePins(self.bDir.path, {"c": C_FP})
        self.b.reload()
        conn = Connection(self.a.serverContextFactory, creator)
        conn.assertRefused(self, "alert unknown ca")

    def test_pinRemovedBetweenConnections(self) -> None:
        """After the server drops b's pin, b's next connection is refused."""
        first = Connection(self.a.serverContextFactory, self.b.clientCreatorFor("a"))
        self.assertTrue(first.exchange())
        writePins(self.aDir.path, {"c": C_FP})
        self.a.reload()
        second = Connection(self.a.serverContextFactory, self.b.clientCreatorFor("a"))
        second.assertRefused(self, "certificate verify failed")
        # The kept-alive first connection is still up, but its peer is no longer pinned.
        self.assertIsNone(self.a.peerNodeId(first.serverTLS))
        first.close()

    def test_pinAddedBetweenConnections(self) -> None:
        """After the server pins c, c's next connection is accepted."""
        first = Connection(self.a.serverContextFactory, self.c.clientCreatorFor("a"))
        first.assertRefused(self, "certificate verify failed")
        writePins(self.aDir.path, {"b": B_FP, "c": C_FP})
        self.a.reload()
        second = Connection(self.a.serverContextFactory, self.c.clientCreatorFor("a"))
        self.assertTrue(second.exchange())
        self.assertEqual(self.a.peerNodeId(second.serverTLS), "c")
        second.close()

    def test_peerNodeIdAfterLeaving(self) -> None:
        """peerNodeId is None once this node is no longer a member."""
        conn = Connection(self.a.serverContextFactory, self.b.clientCreatorFor("a"))
        self.assertTrue(conn.exchange())
        self.aDir.remove("member.json")
        self.a.reload()
        self.assertIsNone(self.a.peerNodeId(conn.serverTLS))
        conn.close()

    def test_peerNodeIdWithoutCertificate(self) -> None:
        """peerNodeId is None for objects without a peer certificate."""
        self.assertIsNone(self.a.peerNodeId(object()))
        self.assertIsNone(self.a.peerNodeId(NoPeer()))

    def test_serverCertRotationUsedOnNextConnection(self) -> None:
        """A rotated server certificate is presented on the next connection."""
        writeNodeTLS(self.aDir.path, C_CERT, C_KEY)
        self.a.reload()
        # b pins a to A_FP: the rotated server no longer matches and is refused.
        refused = Connection(self.a.serverContextFactory, self.b.clientCreatorFor("a"))
        refused.assertRefused(self, "alert unknown ca")
        writePins(self.bDir.path, {"a": C_FP})
        self.b.reload()
        accepted = Connection(self.a.serverContextFactory, self.b.clientCreatorFor("a"))
        self.assertTrue(accepted.exchange())
        accepted.close()

    def test_presentsCurrentIdentityAfterRotation(self) -> None:
        """A connection made under the previous certificate no longer presents the current one."""
        conn = Connection(self.a.serverContextFactory, self.b.clientCreatorFor("a"))
        self.assertTrue(conn.exchange())
        self.assertTrue(self.a.presentsCurrentIdentity(conn.serverTLS))
        self.assertFalse(self.a.presentsCurrentIdentity(NoPeer()))
        writeNodeTLS(self.aDir.path, C_CERT, C_KEY)
        self.a.reload()
        self.assertFalse(self.a.presentsCurrentIdentity(conn.serverTLS))
        conn.close()

    def test_changeLogged(self) -> None:
        """Each reload that changes the trust logs one cluster-changed record (counts only)."""
        events = Events()
        self.assertTrue(verifyObject(ILogObserver, events))
        globalLogPublisher.addObserver(events)
        self.addCleanup(globalLogPublisher.removeObserver, events)
        writePins(self.aDir.path, {"b": B_FP, "c": C_FP})
        self.a.reload()
        self.a.reload()
        changed = [e for e in events if e.get("log_format") == "cluster-changed"]
        self.assertEqual(len(changed), 1)
        self.assertEqual((changed[0]["pins"], changed[0]["member"]), (2, True))
        self.assertNotIn(C_FP, repr(changed[0]))

    def test_contextCachedPerGeneration(self) -> None:
        """The server context is reused until the trust changes."""
        c1 = self.a.serverContextFactory.serverConnectionForTLS(None)  # type: ignore[arg-type]
        c2 = self.a.serverContextFactory.serverConnectionForTLS(None)  # type: ignore[arg-type]
        self.assertIsNot(c1, c2)
        self.assertIs(c1.get_context(), c2.get_context())
        writePins(self.aDir.path, {"b": B_FP, "c": C_FP})
        self.a.reload()
        c3 = self.a.serverContextFactory.serverConnectionForTLS(None)  # type: ignore[arg-type]
        self.assertIsNot(c3.get_context(), c1.get_context())
