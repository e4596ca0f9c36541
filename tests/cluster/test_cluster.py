"""Tests for nvpair.proxy.cluster.membership: the cluster directory watch and pinned mutual TLS."""

from __future__ import annotations

import json
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
from twisted.logger import ILogObserver, LogEvent, globalLogPublisher
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol
from twisted.python.failure import Failure
from twisted.test.iosim import connectedServerAndClient
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.cluster.directory import Standing
from nvpair.proxy.cluster.membership import (
    ClusterTrust,
    NoCredentials,
    NoPin,
    NotAMember,
    fingerprintOf,
)
from nvpair.proxy.testing.certs import (
    makeNodeCert,
    writeClusterDir,
    writeFileAtomic,
    writeMember,
    writeNodeTLS,
    writePins,
)

# Certificates are expensive enough to mint once per test run.
A_CERT, A_KEY, A_FP = makeNodeCert("node-a")
B_CERT, B_KEY, B_FP = makeNodeCert("node-b")
C_CERT, C_KEY, C_FP = makeNodeCert("node-c")


class _Recorder(Protocol):
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


class _Connection:
    """One in-memory TLS connection between a server creator and a client creator."""

    def __init__(
        self,
        serverCreator: IOpenSSLServerConnectionCreator,
        clientCreator: IOpenSSLClientConnectionCreator,
    ) -> None:
        self.clock = Clock()
        serverFactory = TLSMemoryBIOFactory(
            serverCreator, False, Factory.forProtocol(_Recorder), self.clock
        )
        clientFactory = TLSMemoryBIOFactory(
            clientCreator, True, Factory.forProtocol(_Recorder), self.clock
        )
        self.serverTLS: TLSMemoryBIOProtocol = serverFactory.buildProtocol(
            IPv4Address("TCP", "192.0.2.2", 40000)
        )
        self.clientTLS: TLSMemoryBIOProtocol = clientFactory.buildProtocol(
            IPv4Address("TCP", "192.0.2.1", 11435)
        )
        server, client = self.serverTLS.wrappedProtocol, self.clientTLS.wrappedProtocol
        assert isinstance(server, _Recorder) and isinstance(client, _Recorder)
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


class _Dir:
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


class _TrustMixin:
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


class FingerprintTests(SynchronousTestCase):
    """The fingerprint helper."""

    def test_fingerprintOfDER(self) -> None:
        """fingerprintOf is the lowercase hex SHA-256 of the DER, matching makeNodeCert."""
        der = x509.load_pem_x509_certificate(A_CERT).public_bytes(serialization.Encoding.DER)
        fp = fingerprintOf(der)
        self.assertEqual(fp, A_FP)
        self.assertEqual(len(fp), 64)
        self.assertEqual(fp, fp.lower())


class ParsingTests(_TrustMixin, SynchronousTestCase):
    """Reading each file of the cluster directory."""

    def setUp(self) -> None:
        """Prepare an empty cluster directory."""
        self.dir = _Dir(self)

    def test_noClusterDir(self) -> None:
        """Without a cluster directory the node is never a member and nothing is polled."""
        trust = self.makeTrust(None)
        self.assertFalse(trust.isMember)
        self.assertIsNone(trust.nodeId)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertRaises(NotAMember, trust.clientCreatorFor, "b")
        self.assertEqual(self.problems, [])
        self.assertIs(trust.standing, Standing.OFF)

    def test_standing(self) -> None:
        """Not a member, a member without a certificate, then a member that can present one."""
        trust = self.makeTrust(self.dir.path)
        self.assertIs(trust.standing, Standing.NOT_MEMBER)
        writeMember(self.dir.path, "a")
        self.clock.advance(1)
        self.assertIs(trust.standing, Standing.NO_CREDENTIALS)
        writeNodeTLS(self.dir.path, A_CERT, A_KEY)
        self.clock.advance(1)
        self.assertIs(trust.standing, Standing.MEMBER)

    def test_emptyDirectory(self) -> None:
        """An empty directory means not a member, no pins, and no problem."""
        trust = self.makeTrust(self.dir.path)
        self.assertFalse(trust.isMember)
        self.assertIsNone(trust.clusterId)
        self.assertEqual(dict(trust.pins), {})
        self.assertFalse(trust.hasCredentials)
        self.assertEqual(self.problems, [])

    def test_completeDirectory(self) -> None:
        """A complete directory yields membership, ids, credentials and pins."""
        writeClusterDir(self.dir.path, "a", A_CERT, A_KEY, {"b": B_FP}, clusterId="cl-9")
        trust = self.makeTrust(self.dir.path)
        self.assertTrue(trust.isMember)
        self.assertEqual(trust.nodeId, "a")
        self.assertEqual(trust.clusterId, "cl-9")
        self.assertTrue(trust.hasCredentials)
        self.assertEqual(trust.fingerprint, A_FP)
        self.assertEqual(dict(trust.pins), {"b": B_FP})
        self.assertEqual(trust.pinFor("b"), B_FP)
        self.assertIsNone(trust.pinFor("c"))
        self.assertEqual(trust.fingerprintAllowed(B_FP), "b")
        self.assertEqual(trust.fingerprintAllowed(B_FP.upper()), "b")
        self.assertIsNone(trust.fingerprintAllowed(C_FP))
        self.assertEqual(self.problems, [])

    def test_memberExtraFieldsIgnored(self) -> None:
        """Unknown fields in member.json are ignored."""
        self.dir.write(
            "member.json", json.dumps({"clusterId": "c", "nodeId": "n", "x": 1}).encode()
        )
        trust = self.makeTrust(self.dir.path)
        self.assertEqual((trust.isMember, trust.nodeId), (True, "n"))

    def test_uppercasePinsLowercased(self) -> None:
        """Uppercase fingerprints in pins.json are stored lowercase and matched in any case."""
        writePins(self.dir.path, {"b": B_FP.upper()})
        trust = self.makeTrust(self.dir.path)
        self.assertEqual(trust.pinFor("b"), B_FP)
        self.assertEqual(trust.fingerprintAllowed(B_FP), "b")
        self.assertEqual(self.problems, [])

    def assertBadFile(self, name: str, data: bytes, expectInMessage: str) -> ClusterTrust:
        """Write a bad file and assert exactly one problem naming file and problem."""
        self.dir.write(name, data)
        trust = self.makeTrust(self.dir.path)
        self.assertEqual(len(self.problems), 1, self.problems)
        self.assertIn(name, self.problems[0])
        self.assertIn(expectInMessage, self.problems[0])
        return trust

    def test_memberBadJSON(self) -> None:
        """member.json that is not JSON is reported and leaves the node a non-member."""
        trust = self.assertBadFile("member.json", b'{"clusterId": "c", "node', "invalid JSON")
        self.assertFalse(trust.isMember)

    def test_memberNotObject(self) -> None:
        """member.json that is not an object is reported."""
        trust = self.assertBadFile("member.json", b'["a"]', "not a JSON object")
        self.assertFalse(trust.isMember)

    def test_memberMissingNodeId(self) -> None:
        """member.json without a string nodeId is reported."""
        trust = self.assertBadFile("member.json", b'{"clusterId": "c", "nodeId": 3}', "nodeId")
        self.assertFalse(trust.isMember)

    def test_memberMissingClusterId(self) -> None:
        """member.json without a clusterId is reported."""
        trust = self.assertBadFile("member.json", b'{"nodeId": "n"}', "clusterId")
        self.assertFalse(trust.isMember)

    def test_memberNotUTF8(self) -> None:
        """member.json that is not UTF-8 is reported."""
        self.assertBadFile("member.json", b'{"nodeId": "\xff"}', "UTF-8")

    def test_pinsBadJSON(self) -> None:
        """pins.json that is not JSON is reported and leaves no pins."""
        trust = self.assertBadFile("pins.json", b'{"pins": {', "invalid JSON")
        self.assertEqual(dict(trust.pins), {})

    def test_pinsWrongShape(self) -> None:
        """pins.json whose pins is not an object is reported."""
        trust = self.assertBadFile("pins.json", b'{"pins": ["x"]}', '"pins" object')
        self.assertEqual(dict(trust.pins), {})

    def test_pinsTopLevelNotObject(self) -> None:
        """pins.json that is a bare list is reported."""
        self.assertBadFile("pins.json", b"[]", '"pins" object')

    def test_pinsBadHex(self) -> None:
        """A pin that is not 64 hex digits makes the whole file bad."""
        bad = {"pins": {"b": B_FP, "c": "z" * 64}}
        trust = self.assertBadFile("pins.json", json.dumps(bad).encode(), "64 hex digits")
        self.assertEqual(dict(trust.pins), {})

    def test_pinsShortHex(self) -> None:
        """A pin of the wrong length is reported."""
        bad = {"pins": {"b": B_FP[:-1]}}
        self.assertBadFile("pins.json", json.dumps(bad).encode(), "64 hex digits")

    def test_pinsNotString(self) -> None:
        """A pin that is not a string is reported."""
        self.assertBadFile("pins.json", b'{"pins": {"b": 12}}', "64 hex digits")

    def test_pinsDuplicateFingerprint(self) -> None:
        """Two node ids with one fingerprint (case aside) make the file bad."""
        bad = {"pins": {"b": B_FP, "c": B_FP.upper()}}
        self.assertBadFile("pins.json", json.dumps(bad).encode(), "same fingerprint")

    def test_certNotPEM(self) -> None:
        """A certificate that does not load is reported; there are no credentials."""
        self.dir.write("tls/node.key", A_KEY)
        trust = self.assertBadFile("tls/node.crt", b"-----BEGIN CERTIFICATE-----\nxx", "PEM")
        self.assertFalse(trust.hasCredentials)

    def test_keyNotPEMNoKeyMaterialInMessage(self) -> None:
        """A key that does not load is reported without echoing any of its content."""
        self.dir.write("tls/node.crt", A_CERT)
        garbage = A_KEY[:60] + b"SECRETSECRET" + A_KEY[-40:]
        trust = self.assertBadFile("tls/node.key", garbage, "not a PEM private key")
        self.assertNotIn("SECRET", self.problems[0])
        self.assertNotIn("BEGIN", self.problems[0])
        self.assertFalse(trust.hasCredentials)

    def test_keyCertMismatch(self) -> None:
        """A key that does not belong to the certificate is reported."""
        self.dir.write("tls/node.crt", A_CERT)
        trust = self.assertBadFile("tls/node.key", B_KEY, "does not match")
        self.assertFalse(trust.hasCredentials)

    def test_keyMissing(self) -> None:
        """A certificate without its key is reported."""
        self.dir.write("tls/node.crt", A_CERT)
        trust = self.makeTrust(self.dir.path)
        self.assertEqual(self.problems, ["tls/node.key: missing"])
        self.assertFalse(trust.hasCredentials)

    def test_certMissing(self) -> None:
        """A key without its certificate is reported."""
        self.dir.write("tls/node.key", A_KEY)
        self.makeTrust(self.dir.path)
        self.assertEqual(self.problems, ["tls/node.crt: missing"])

    def test_memberWithoutCredentials(self) -> None:
        """A member with no tls/ files is reported once, and cannot reach peers."""
        writeMember(self.dir.path, "a")
        writePins(self.dir.path, {"b": B_FP})
        trust = self.makeTrust(self.dir.path)
        self.assertTrue(trust.isMember)
        self.assertEqual(len(self.problems), 1)
        self.assertIn("tls/node.crt", self.problems[0])
        self.clock.advance(1)
        self.clock.advance(1)
        self.assertEqual(len(self.problems), 1)
        self.assertRaises(NoCredentials, trust.clientCreatorFor, "b")


class WatchTests(_TrustMixin, SynchronousTestCase):
    """Changes to the directory are noticed on the injected clock."""

    def setUp(self) -> None:
        """Prepare a complete cluster directory for node a pinning b."""
        self.dir = _Dir(self)
        writeClusterDir(self.dir.path, "a", A_CERT, A_KEY, {"b": B_FP})

    def test_membershipToggles(self) -> None:
        """Removing and recreating member.json is noticed after one interval."""
        trust = self.makeTrust(self.dir.path, interval=0.5)
        self.assertTrue(trust.isMember)
        self.dir.remove("member.json")
        self.clock.advance(0.4)
        self.assertTrue(trust.isMember)
        self.clock.advance(0.1)
        self.assertFalse(trust.isMember)
        self.assertIsNone(trust.nodeId)
        self.assertRaises(NotAMember, trust.clientCreatorFor, "b")
        writeMember(self.dir.path, "a2", "c2")
        self.clock.advance(0.5)
        self.assertTrue(trust.isMember)
        self.assertEqual((trust.nodeId, trust.clusterId), ("a2", "c2"))
        self.assertEqual(self.problems, [])

    def test_reloadNow(self) -> None:
        """reload() applies a change without waiting for the timer."""
        trust = self.makeTrust(self.dir.path)
        self.dir.remove("member.json")
        trust.reload()
        self.assertFalse(trust.isMember)

    def test_stopStopsPolling(self) -> None:
        """After stop() nothing is polled any more."""
        trust = self.makeTrust(self.dir.path)
        trust.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.dir.remove("member.json")
        self.clock.advance(5)
        self.assertTrue(trust.isMember)

    def test_pinAddedAndRemoved(self) -> None:
        """Adding and removing pins is noticed and bumps the generation."""
        trust = self.makeTrust(self.dir.path)
        generation = trust.generation
        writePins(self.dir.path, {"b": B_FP, "c": C_FP})
        self.clock.advance(1)
        self.assertEqual(trust.fingerprintAllowed(C_FP), "c")
        self.assertGreater(trust.generation, generation)
        generation = trust.generation
        writePins(self.dir.path, {"c": C_FP})
        self.clock.advance(1)
        self.assertIsNone(trust.fingerprintAllowed(B_FP))
        self.assertIsNone(trust.pinFor("b"))
        self.assertRaises(NoPin, trust.clientCreatorFor, "b")
        self.assertGreater(trust.generation, generation)

    def test_sameSizeQuickRewriteNoticed(self) -> None:
        """A same-size rewrite right after the previous one is still noticed."""
        trust = self.makeTrust(self.dir.path)
        writePins(self.dir.path, {"c": B_FP})
        self.clock.advance(1)
        writePins(self.dir.path, {"c": C_FP})
        self.clock.advance(1)
        self.assertEqual(trust.pinFor("c"), C_FP)

    def test_pinsFileRemoved(self) -> None:
        """Removing pins.json leaves no pins."""
        trust = self.makeTrust(self.dir.path)
        self.dir.remove("pins.json")
        self.clock.advance(1)
        self.assertEqual(dict(trust.pins), {})
        self.assertEqual(self.problems, [])

    def test_unchangedIsQuiet(self) -> None:
        """Polling an unchanged directory changes no generation and reports nothing."""
        trust = self.makeTrust(self.dir.path)
        generation = trust.generation
        self.clock.pump([1] * 5)
        self.assertEqual(trust.generation, generation)
        self.assertEqual(self.problems, [])

    def test_unchangedOldFilesNotReread(self) -> None:
        """Files whose stat is unchanged (and not recent) are not read again."""
        reads: list[str] = []
        trust = self.makeTrust(self.dir.path, racyWindow=0)
        original = trust._readFile

        def counting(path: str) -> tuple[bytes, os.stat_result]:
            reads.append(os.path.basename(path))
            return original(path)

        trust._readFile = counting  # type: ignore[method-assign]
        self.clock.pump([1] * 3)
        self.assertEqual(reads, [])
        writePins(self.dir.path, {"c": C_FP})
        self.clock.advance(1)
        self.assertEqual(reads, ["pins.json"])
        self.assertEqual(trust.pinFor("c"), C_FP)

    def test_halfWrittenKeepsLastGood(self) -> None:
        """A half-written pins.json keeps the last good pins and is reported once."""
        trust = self.makeTrust(self.dir.path)
        generation = trust.generation
        full = json.dumps({"pins": {"b": B_FP, "c": C_FP}}).encode()
        self.dir.writeInPlace("pins.json", full[: len(full) // 2])
        self.clock.pump([1] * 4)
        self.assertEqual(dict(trust.pins), {"b": B_FP})
        self.assertEqual(trust.generation, generation)
        self.assertEqual(len(self.problems), 1)
        self.assertIn("pins.json", self.problems[0])
        self.dir.writeInPlace("pins.json", full)
        self.clock.advance(1)
        self.assertEqual(dict(trust.pins), {"b": B_FP, "c": C_FP})
        self.assertEqual(len(self.problems), 1)

    def test_distinctBadVersionsReportedEach(self) -> None:
        """Each distinct bad version is reported once; bad again after good is reported."""
        trust = self.makeTrust(self.dir.path)
        self.dir.write("pins.json", b"{")
        self.clock.advance(1)
        self.dir.write("pins.json", b"{{")
        self.clock.advance(1)
        self.clock.advance(1)
        self.assertEqual(len(self.problems), 2)
        writePins(self.dir.path, {"b": B_FP})
        self.clock.advance(1)
        self.dir.write("pins.json", b"{")
        self.clock.advance(1)
        self.assertEqual(len(self.problems), 3)
        self.assertEqual(dict(trust.pins), {"b": B_FP})

    def test_badMemberKeepsLastGood(self) -> None:
        """An invalid member.json keeps the previous membership."""
        trust = self.makeTrust(self.dir.path)
        self.dir.write("member.json", b'{"nodeId": ')
        self.clock.advance(1)
        self.assertTrue(trust.isMember)
        self.assertEqual(trust.nodeId, "a")
        self.assertEqual(len(self.problems), 1)
        self.assertIn("member.json", self.problems[0])

    def test_certRotation(self) -> None:
        """A new certificate and key are picked up and bump the generation."""
        trust = self.makeTrust(self.dir.path)
        generation = trust.generation
        writeNodeTLS(self.dir.path, C_CERT, C_KEY)
        self.clock.advance(1)
        self.assertEqual(trust.fingerprint, C_FP)
        self.assertGreater(trust.generation, generation)
        self.assertEqual(self.problems, [])

    def test_mismatchedRotationKeepsOldCredentials(self) -> None:
        """A certificate replaced without its key keeps the old pair and is reported."""
        trust = self.makeTrust(self.dir.path)
        self.dir.write("tls/node.crt", C_CERT)
        self.clock.advance(1)
        self.assertEqual(trust.fingerprint, A_FP)
        self.assertEqual(len(self.problems), 1)
        self.assertIn("does not match", self.problems[0])
        self.dir.write("tls/node.key", C_KEY)
        self.clock.advance(1)
        self.assertEqual(trust.fingerprint, C_FP)
        self.assertEqual(len(self.problems), 1)

    def test_tlsFilesRemovedKeepsCredentials(self) -> None:
        """Removing both TLS files keeps the previous certificate and is reported."""
        trust = self.makeTrust(self.dir.path)
        self.dir.remove("tls/node.crt")
        self.dir.remove("tls/node.key")
        self.clock.advance(1)
        self.assertEqual(trust.fingerprint, A_FP)
        self.assertEqual(len(self.problems), 1)

    def test_unreadableReportedOnce(self) -> None:
        """A path that cannot be read as a file is reported once and keeps the last state."""
        trust = self.makeTrust(self.dir.path)
        self.dir.remove("pins.json")
        os.mkdir(self.dir.file("pins.json"))
        self.clock.pump([1] * 3)
        self.assertEqual(len(self.problems), 1)
        self.assertIn("pins.json", self.problems[0])
        self.assertEqual(dict(trust.pins), {"b": B_FP})

    def test_oversizedFileRefused(self) -> None:
        """A file larger than 1 MiB is reported, not read, and the last state is kept."""
        trust = self.makeTrust(self.dir.path)
        self.dir.write("pins.json", b" " * ((1 << 20) + 1))
        self.clock.advance(1)
        self.assertEqual(len(self.problems), 1)
        self.assertIn("too large", self.problems[0])
        self.assertEqual(dict(trust.pins), {"b": B_FP})

    def test_unexpectedErrorKeepsWatching(self) -> None:
        """An unexpected exception during a check is reported and that version retried."""
        trust = self.makeTrust(self.dir.path, racyWindow=0)
        original = trust._applyPins
        calls: list[int] = []

        def failing(contents: tuple[bytes | None, ...]) -> None:
            if not calls:
                calls.append(1)
                raise RuntimeError("surprise")
            original(contents)

        trust._applyPins = failing  # type: ignore[method-assign]
        writePins(self.dir.path, {"c": C_FP})
        self.clock.advance(1)
        self.assertEqual(self.problems, ["cluster directory check failed: RuntimeError"])
        self.assertEqual(dict(trust.pins), {"b": B_FP})
        self.clock.advance(1)
        self.assertEqual(dict(trust.pins), {"c": C_FP})

    def test_problemCallbackFailureDoesNotStopWatch(self) -> None:
        """An exception raised by onProblem does not stop the polling."""
        clock = Clock()

        def explode(message: str) -> None:
            raise RuntimeError("boom")

        trust = ClusterTrust(self.dir.path, clock, explode)
        trust.start()
        self.addCleanup(trust.stop)
        self.dir.write("pins.json", b"{")
        clock.advance(1)
        self.dir.remove("member.json")
        clock.advance(1)
        self.assertFalse(trust.isMember)


class HandshakeTests(SynchronousTestCase):
    """In-memory mutual-TLS handshakes between two ClusterTrust objects."""

    def setUp(self) -> None:
        """Node a (server) pins b; node b (client) pins a; node c is pinned by nobody."""
        self.problems: list[str] = []
        self.aDir = _Dir(self)
        self.bDir = _Dir(self)
        self.cDir = _Dir(self)
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
        conn = _Connection(self.a.serverContextFactory, self.b.clientCreatorFor("a"))
        self.assertTrue(conn.exchange())
        self.assertEqual(self.a.peerNodeId(conn.serverTLS), "b")
        self.assertEqual(self.b.peerNodeId(conn.clientTLS), "a")
        conn.close()
        self.assertEqual(self.problems, [])

    def test_policyCreator(self) -> None:
        """The node policy's creator ignores the netloc and completes the handshake."""
        creator = self.b.policyForNode("a").creatorForNetloc(b"10.0.0.9", 11435)
        conn = _Connection(self.a.serverContextFactory, creator)
        self.assertTrue(conn.exchange())
        conn.close()

    def test_unpinnedClientRefused(self) -> None:
        """A client whose certificate is not pinned by the server is refused."""
        conn = _Connection(self.a.serverContextFactory, self.c.clientCreatorFor("a"))
        conn.assertRefused(self, "certificate verify failed")
        self.assertIsNone(self.a.peerNodeId(conn.serverTLS))

    def test_noClientCertificateRefused(self) -> None:
        """A client presenting no certificate is refused."""
        creator = _NoCertClient(A_FP)
        conn = _Connection(self.a.serverContextFactory, creator)
        conn.assertRefused(self, "peer did not return a certificate")

    def test_sanityNoCertClientWorksAgainstPlainServer(self) -> None:
        """The certificate-less test client can complete a handshake when none is required."""
        server, client = _PlainServer(), _NoCertClient(A_FP)
        self.assertTrue(verifyObject(IOpenSSLServerConnectionCreator, server))
        self.assertTrue(verifyObject(IOpenSSLClientConnectionCreator, client))
        conn = _Connection(server, client)
        self.assertTrue(conn.exchange())
        conn.close()

    def test_clientRefusesWrongServer(self) -> None:
        """A client expecting node c refuses node a's server, though a would accept it."""
        conn = _Connection(self.a.serverContextFactory, self.b.clientCreatorFor("c"))
        conn.assertRefused(self, "alert unknown ca")

    def test_nonMemberServerRefuses(self) -> None:
        """A server that is not a member refuses even a pinned client."""
        self.aDir.remove("member.json")
        self.a.reload()
        self.assertFalse(self.a.isMember)
        conn = _Connection(self.a.serverContextFactory, self.b.clientCreatorFor("a"))
        conn.assertRefused(self, "no shared cipher")

    def test_serverWithoutCredentialsRefuses(self) -> None:
        """A member with no certificate yet refuses every connection."""
        d = _Dir(self)
        writeMember(d.path, "a")
        writePins(d.path, {"b": B_FP})
        server = self.trust(d.path)
        conn = _Connection(server.serverContextFactory, self.b.clientCreatorFor("a"))
        conn.assertRefused(self, "no shared cipher")

    def test_clientCreatorAfterLeavingRefuses(self) -> None:
        """A creator obtained before the client left the cluster fails its next handshake."""
        creator = self.b.clientCreatorFor("a")
        self.bDir.remove("member.json")
        self.b.reload()
        conn = _Connection(self.a.serverContextFactory, creator)
        conn.assertRefused(self, "alert unknown ca")

    def test_clientCreatorAfterPinRemovedRefuses(self) -> None:
        """A creator obtained before the server's pin was removed fails its next handshake."""
        creator = self.b.clientCreatorFor("a")
        writePins(self.bDir.path, {"c": C_FP})
        self.b.reload()
        conn = _Connection(self.a.serverContextFactory, creator)
        conn.assertRefused(self, "alert unknown ca")

    def test_pinRemovedBetweenConnections(self) -> None:
        """After the server drops b's pin, b's next connection is refused."""
        first = _Connection(self.a.serverContextFactory, self.b.clientCreatorFor("a"))
        self.assertTrue(first.exchange())
        writePins(self.aDir.path, {"c": C_FP})
        self.a.reload()
        second = _Connection(self.a.serverContextFactory, self.b.clientCreatorFor("a"))
        second.assertRefused(self, "certificate verify failed")
        # The kept-alive first connection is still up, but its peer is no longer pinned.
        self.assertIsNone(self.a.peerNodeId(first.serverTLS))
        first.close()

    def test_pinAddedBetweenConnections(self) -> None:
        """After the server pins c, c's next connection is accepted."""
        first = _Connection(self.a.serverContextFactory, self.c.clientCreatorFor("a"))
        first.assertRefused(self, "certificate verify failed")
        writePins(self.aDir.path, {"b": B_FP, "c": C_FP})
        self.a.reload()
        second = _Connection(self.a.serverContextFactory, self.c.clientCreatorFor("a"))
        self.assertTrue(second.exchange())
        self.assertEqual(self.a.peerNodeId(second.serverTLS), "c")
        second.close()

    def test_peerNodeIdAfterLeaving(self) -> None:
        """peerNodeId is None once this node is no longer a member."""
        conn = _Connection(self.a.serverContextFactory, self.b.clientCreatorFor("a"))
        self.assertTrue(conn.exchange())
        self.aDir.remove("member.json")
        self.a.reload()
        self.assertIsNone(self.a.peerNodeId(conn.serverTLS))
        conn.close()

    def test_peerNodeIdWithoutCertificate(self) -> None:
        """peerNodeId is None for objects without a peer certificate."""
        self.assertIsNone(self.a.peerNodeId(object()))
        self.assertIsNone(self.a.peerNodeId(_NoPeer()))

    def test_serverCertRotationUsedOnNextConnection(self) -> None:
        """A rotated server certificate is presented on the next connection."""
        writeNodeTLS(self.aDir.path, C_CERT, C_KEY)
        self.a.reload()
        # b pins a to A_FP: the rotated server no longer matches and is refused.
        refused = _Connection(self.a.serverContextFactory, self.b.clientCreatorFor("a"))
        refused.assertRefused(self, "alert unknown ca")
        writePins(self.bDir.path, {"a": C_FP})
        self.b.reload()
        accepted = _Connection(self.a.serverContextFactory, self.b.clientCreatorFor("a"))
        self.assertTrue(accepted.exchange())
        accepted.close()

    def test_presentsCurrentIdentityAfterRotation(self) -> None:
        """A connection made under the previous certificate no longer presents the current one."""
        conn = _Connection(self.a.serverContextFactory, self.b.clientCreatorFor("a"))
        self.assertTrue(conn.exchange())
        self.assertTrue(self.a.presentsCurrentIdentity(conn.serverTLS))
        self.assertFalse(self.a.presentsCurrentIdentity(_NoPeer()))
        writeNodeTLS(self.aDir.path, C_CERT, C_KEY)
        self.a.reload()
        self.assertFalse(self.a.presentsCurrentIdentity(conn.serverTLS))
        conn.close()

    def test_changeLogged(self) -> None:
        """Each reload that changes the trust logs one cluster-changed record (counts only)."""
        events = _Events()
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


class _NoPeer:
    """A transport-like object whose peer certificate is absent."""

    def getPeerCertificate(self) -> None:
        """No certificate."""
        return None


@implementer(ILogObserver)
class _Events(list[LogEvent]):
    """A log observer keeping every event."""

    def __call__(self, event: LogEvent) -> None:
        self.append(event)


def _verifyPinned(fp: str) -> Callable[[SSL.Connection, crypto.X509, int, int, int], bool]:
    """A verify callback accepting only the leaf with fingerprint ``fp``."""

    def verify(conn: SSL.Connection, cert: crypto.X509, errnum: int, depth: int, ok: int) -> bool:
        if depth > 0:
            return True
        der = cert.to_cryptography().public_bytes(serialization.Encoding.DER)
        return fingerprintOf(der) == fp

    return verify


@implementer(IOpenSSLClientConnectionCreator)
class _NoCertClient:
    """A client creator that presents no certificate but checks the server's pin."""

    def __init__(self, serverFP: str) -> None:
        self._ctx = SSL.Context(SSL.TLS_METHOD)
        self._ctx.set_verify(SSL.VERIFY_PEER, _verifyPinned(serverFP))

    def clientConnectionForTLS(self, tlsProtocol: TLSMemoryBIOProtocol) -> SSL.Connection:
        """A fresh client connection."""
        return SSL.Connection(self._ctx, None)


@implementer(IOpenSSLServerConnectionCreator)
class _PlainServer:
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
