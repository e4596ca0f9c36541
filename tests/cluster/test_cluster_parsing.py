"""ClusterTrust reading the cluster directory: fingerprints, member.json, pins.json, TLS files.

Each file's valid and invalid shapes as read once at start (nvpair.proxy.cluster.membership).
"""

from __future__ import annotations

import json

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.cluster.directory import Standing
from nvpair.proxy.cluster.files import fingerprintOf
from nvpair.proxy.cluster.membership import ClusterTrust
from nvpair.proxy.cluster.tls import NoCredentials, NotAMember
from nvpair.proxy.testing.certs import writeClusterDir, writeMember, writeNodeTLS, writePins
from tests.cluster.trustkit import A_CERT, A_FP, A_KEY, B_FP, B_KEY, C_FP, Dir, TrustMixin


class FingerprintTests(SynchronousTestCase):
    """The fingerprint helper."""

    def test_fingerprintOfDER(self) -> None:
        """fingerprintOf is the lowercase hex SHA-256 of the DER, matching makeNodeCert."""
        der = x509.load_pem_x509_certificate(A_CERT).public_bytes(serialization.Encoding.DER)
        fp = fingerprintOf(der)
        self.assertEqual(fp, A_FP)
        self.assertEqual(len(fp), 64)
        self.assertEqual(fp, fp.lower())


class ParsingTests(TrustMixin, SynchronousTestCase):
    """Reading each file of the cluster directory."""

    def setUp(self) -> None:
        """Prepare an empty cluster directory."""
        self.dir = Dir(self)

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
