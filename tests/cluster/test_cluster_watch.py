"""ClusterTrust watching the cluster directory: changes noticed on the poll, bad versions.

Membership toggles, pin and certificate rotation, half-written and unreadable files keeping the
last good state, and problems reported once (nvpair.proxy.cluster.membership).
"""

from __future__ import annotations

import json
import os

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.cluster.membership import ClusterTrust
from nvpair.proxy.cluster.tls import NoPin, NotAMember
from nvpair.proxy.testing.certs import writeClusterDir, writeMember, writeNodeTLS, writePins
from tests.cluster.trustkit import A_CERT, A_FP, A_KEY, B_FP, C_CERT, C_FP, C_KEY, Dir, TrustMixin


class WatchTests(TrustMixin, SynchronousTestCase):
    """Changes to the directory are noticed on the injected clock."""

    def setUp(self) -> None:
        """Prepare a complete cluster directory for node a pinning b."""
        self.dir = Dir(self)
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
