"""The room ledger (``nodestate.ledger``, spec §11 "Room"): one rule for free now and known
full from the engine's report, ``max_concurrency`` and busy answers; the probe race; bounds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nvpair.proxy.facade.fleetfile import Backend
from nvpair.proxy.facade.reload import IFleetFollower
from nvpair.proxy.facade.standalone import SlotLimits
from nvpair.proxy.nodestate.interfaces import IRoomLedger
from nvpair.proxy.nodestate.ledger import (
    BUSY_HOLD,
    GROW_EVERY,
    MAX_LISTENERS,
    SERVED_RECENTLY,
    RoomLedger,
    isBusyAnswer,
)

A = "http://a:1"


class Fixture:
    """A ledger over an in-flight map the test moves like the process's ``Activity``."""

    def __init__(self, maxNodes: int = 1024) -> None:
        self.clock = Clock()
        self.ours: dict[str, int] = {}
        self.ledger = RoomLedger(self.clock, self.ours, maxNodes)

    def start(self, nodeId: str = A, count: int = 1) -> None:
        for _ in range(count):
            self.ours[nodeId] = self.ours.get(nodeId, 0) + 1
            self.ledger.activityChanged(nodeId, +1)

    def end(self, nodeId: str = A) -> None:
        self.ours[nodeId] -= 1
        self.ledger.activityChanged(nodeId, -1)

    def probe(self, nodeId: str, busy: int | None, total: int | None) -> None:
        self.ledger.probeSent(nodeId)
        self.ledger.probed(nodeId, busy, total, 1.0)


class FreeNowTests(SynchronousTestCase):
    """Free now is the least of what the report, the configured and the learnt limit allow."""

    def setUp(self) -> None:
        self.f = Fixture()
        self.ledger = self.f.ledger

    def test_provides(self) -> None:
        verifyObject(IRoomLedger, self.ledger)

    def test_unknownWithoutSources(self) -> None:
        """Nothing reported, configured or learnt: unknown, never full."""
        self.f.start()
        self.assertIsNone(self.ledger.free(A))
        self.assertFalse(self.ledger.knownFull(A))
        self.assertIsNone(self.ledger.capacity(A))

    def test_reportedLessOursSinceProbe(self) -> None:
        """Our requests started since a probe use up the free slots it reported; those
        that end give them back at once (not only at the next probe)."""
        self.f.probe(A, busy=0, total=2)
        self.assertEqual(self.ledger.free(A), 2)
        self.f.start(count=2)
        self.assertEqual(self.ledger.free(A), 0)
        self.assertTrue(self.ledger.knownFull(A))
        self.f.end()
        self.assertEqual(self.ledger.free(A), 1)

    def test_foreignSlotsCount(self) -> None:
        """Busy slots that are not ours (direct clients) stay taken after our own end."""
        self.f.start()
        self.f.probe(A, busy=2, total=2)  # one ours, one foreign
        self.assertTrue(self.ledger.knownFull(A))
        self.f.end()
        self.assertEqual(self.ledger.free(A), 1)
        self.assertEqual(self.ledger.status(A)["slotsForeign"], 1)

    def test_staleReportIsUnknown(self) -> None:
        """A report older than two intervals says nothing; a failed probe forgets it."""
        self.f.probe(A, busy=1, total=4)
        self.f.clock.advance(2.0)
        self.assertEqual(self.ledger.free(A), 3)
        self.f.clock.advance(0.1)
        self.assertIsNone(self.ledger.free(A))
        self.f.probe(A, busy=1, total=4)
        self.ledger.probeFailed(A)
        self.assertIsNone(self.ledger.free(A))

    def test_configuredLimit(self) -> None:
        """``max_concurrency`` bounds our requests whatever the engine reports (the least
        wins); cleared, it no longer counts."""
        self.ledger.configure(A, 2)
        self.assertEqual((self.ledger.free(A), self.ledger.capacity(A)), (2, 2))
        self.f.start(count=2)
        self.assertTrue(self.ledger.knownFull(A))
        self.f.probe(A, busy=2, total=8)
        self.assertEqual(self.ledger.free(A), 0)
        self.ledger.configure(A, None)
        self.assertEqual(self.ledger.free(A), 6)
        self.assertNotIn("slotsLimit", self.ledger.status(A))

    def test_metricsProbeWithDeferred(self) -> None:
        """llama.cpp's ``/metrics`` reports no total unless requests wait (total = busy):
        then the node is full."""
        self.f.probe(A, busy=3, total=None)
        self.assertIsNone(self.ledger.free(A))
        self.f.probe(A, busy=3, total=3)
        self.assertTrue(self.ledger.knownFull(A))


class ProbeRaceTests(SynchronousTestCase):
    """A request sent while a probe is in flight is neither counted twice nor missed."""

    def setUp(self) -> None:
        self.f = Fixture()
        self.ledger = self.f.ledger

    def test_settledReportIsExact(self) -> None:
        """Nothing of ours started or ended in flight: foreign = busy - ours."""
        self.f.start()
        self.f.probe(A, busy=3, total=4)
        self.assertEqual(self.ledger.status(A)["slotsForeign"], 2)
        self.assertFalse(self.ledger.unsettled(A))

    def test_startSeenByEngineNotCountedTwice(self) -> None:
        """A request sent while the probe was in flight that the engine counted: with the
        previous estimate of foreign load kept, it is counted once."""
        self.f.probe(A, busy=1, total=4)  # one foreign
        self.ledger.probeSent(A)
        self.f.start()
        self.ledger.probed(A, 2, 4, 1.0)  # the engine saw it
        self.assertEqual(self.ledger.free(A), 2)
        self.assertTrue(self.ledger.unsettled(A))

    def test_startNotSeenByEngineNotMissed(self) -> None:
        """The same request, not yet counted by the engine: still counted once."""
        self.f.probe(A, busy=1, total=4)
        self.ledger.probeSent(A)
        self.f.start()
        self.ledger.probed(A, 1, 4, 1.0)  # the engine had not seen it yet
        self.assertEqual(self.ledger.free(A), 2)

    def test_endDuringFlight(self) -> None:
        """One of ours ending while the probe flies: counted once either way."""
        self.f.start()
        self.f.probe(A, busy=2, total=4)  # one foreign
        self.ledger.probeSent(A)
        self.f.end()
        self.ledger.probed(A, 2, 4, 1.0)  # the engine still counted it
        self.assertEqual(self.ledger.free(A), 3)
        self.ledger.probeSent(A)
        self.ledger.probed(A, 1, 4, 1.0)
        self.assertEqual(self.ledger.free(A), 3)

    def test_noPreviousEstimateIsConservative(self) -> None:
        """A first report that raced: the upper bound of foreign load (never count free a
        slot that may be taken); the next settled probe corrects it."""
        self.ledger.probeSent(A)
        self.f.start()
        self.ledger.probed(A, 1, 2, 1.0)
        self.assertTrue(self.ledger.knownFull(A))
        self.f.probe(A, busy=1, total=2)
        self.assertEqual(self.ledger.free(A), 1)
        self.assertFalse(self.ledger.unsettled(A))

    def test_foreignChangeIsFollowed(self) -> None:
        """Foreign load that changed beyond what the race can explain is taken from the
        report (clamped into the interval the race allows)."""
        self.f.probe(A, busy=0, total=4)
        self.ledger.probeSent(A)
        self.f.start()
        self.ledger.probed(A, 3, 4, 1.0)  # at least two foreign now
        self.assertEqual(self.ledger.status(A)["slotsForeign"], 2)

    def test_foreignFreesOnTwoReports(self) -> None:
        """A direct client's slot read free once (a probe between its back-to-back
        requests) stays taken; a second report in a row frees it; after a stale gap the
        first report is believed."""
        self.f.probe(A, busy=1, total=2)
        self.assertEqual(self.ledger.free(A), 1)
        self.f.clock.advance(1.0)
        self.f.probe(A, busy=0, total=2)
        self.assertEqual((self.ledger.free(A), self.ledger.status(A)["slotsForeign"]), (1, 1))
        self.f.clock.advance(1.0)
        self.f.probe(A, busy=0, total=2)
        self.assertEqual(self.ledger.free(A), 2)
        self.f.probe(A, busy=1, total=2)
        self.assertEqual(self.ledger.free(A), 1, "a rise is believed at once")
        self.f.clock.advance(2.5)
        self.f.probe(A, busy=0, total=2)
        self.assertEqual(self.ledger.free(A), 2)

    @given(
        foreign=st.integers(0, 4),
        before=st.integers(0, 4),
        started=st.integers(0, 3),
        ended=st.integers(0, 3),
        seenStarts=st.integers(0, 3),
        seenEnds=st.integers(0, 3),
    )
    def test_steadyForeignIsExact(
        self, foreign: int, before: int, started: int, ended: int, seenStarts: int, seenEnds: int
    ) -> None:
        """Whatever the engine saw of ours in flight, with steady foreign load the ledger's
        free slots are exactly total - foreign - ours."""
        ended = min(ended, before)
        seenStarts, seenEnds = min(seenStarts, started), min(seenEnds, ended)
        f = Fixture()
        f.start(A, before)
        f.probe(A, busy=foreign + before, total=16)
        f.ledger.probeSent(A)
        f.start(A, started)
        for _ in range(ended):
            f.end(A)
        seen = before + seenStarts - seenEnds
        f.ledger.probed(A, foreign + seen, 16, 1.0)
        self.assertEqual(f.ledger.free(A), 16 - foreign - f.ours.get(A, 0))


class BusyAnswerTests(SynchronousTestCase):
    """Busy answers teach a limit that grows back (additive increase) or is forgotten."""

    def setUp(self) -> None:
        self.f = Fixture()
        self.ledger = self.f.ledger

    def test_rule(self) -> None:
        self.assertTrue(isBusyAnswer(429, 0, False))
        self.assertTrue(isBusyAnswer(503, 1, True))
        self.assertFalse(isBusyAnswer(503, 0, True))
        self.assertFalse(isBusyAnswer(503, 2, False))
        self.assertFalse(isBusyAnswer(500, 2, True))

    def test_learntAndGrown(self) -> None:
        """A 503 while two of ours run and it served recently: limit 2, full while two
        run; grows to 3 after ``GROW_EVERY`` while they fill it."""
        self.ledger.served(A)
        self.f.start(count=2)
        self.assertFalse(self.ledger.busyAnswer(A, 500, None))
        self.assertTrue(self.ledger.busyAnswer(A, 503, None))
        self.assertTrue(self.ledger.knownFull(A))
        self.assertEqual(self.ledger.wakeAt(A), GROW_EVERY)
        self.f.clock.advance(GROW_EVERY)
        self.assertEqual(self.ledger.free(A), 1)
        self.assertEqual(self.ledger.status(A)["learntLimit"], 3)

    def test_forgottenWhenNotFilled(self) -> None:
        """Due while ours do not fill it: forgotten."""
        self.f.start(count=2)
        self.ledger.busyAnswer(A, 429, None)
        self.f.end()
        self.f.clock.advance(GROW_EVERY)
        self.assertIsNone(self.ledger.free(A))
        self.assertEqual(self.ledger.wakeAt(A), 0.0)

    def test_burstShrinks(self) -> None:
        """Busy again before it grew: one less each time, down to one."""
        self.f.start(count=3)
        self.ledger.busyAnswer(A, 429, None)
        self.ledger.busyAnswer(A, 429, None)
        self.ledger.busyAnswer(A, 429, None)
        self.ledger.busyAnswer(A, 429, None)
        self.assertEqual(self.ledger.status(A)["learntLimit"], 1)

    def test_zeroHoldsRetryAfter(self) -> None:
        """A 429 with none of ours there: full for the engine's ``Retry-After`` (at least
        ``BUSY_HOLD``), then it may take one."""
        self.ledger.busyAnswer(A, 429, 3.0)
        self.assertTrue(self.ledger.knownFull(A))
        self.f.clock.advance(3.0)
        self.assertEqual(self.ledger.free(A), 1)
        self.ledger.busyAnswer(A, 429, None)
        self.assertEqual(self.ledger.wakeAt(A), 3.0 + BUSY_HOLD)

    def test_servedLongAgoIsFailing(self) -> None:
        """A 503 from a node that has not served ours within ``SERVED_RECENTLY``: failing."""
        self.ledger.served(A)
        self.f.clock.advance(SERVED_RECENTLY + 1)
        self.f.start()
        self.assertFalse(self.ledger.busyAnswer(A, 503, None))


class LedgerBoundsTests(SynchronousTestCase):
    """Listeners, records and service times are bounded."""

    def test_listeners(self) -> None:
        """Listeners hear of ends, probes and limit changes (not of starts or failed
        probes) until they unsubscribe; their number is bounded."""
        f = Fixture()
        heard: list[str] = []
        unsubscribe = f.ledger.subscribe(heard.append)
        f.start()
        f.end()
        f.probe("B", busy=0, total=1)
        f.ledger.probeFailed("C")
        f.ledger.configure("D", 2)
        f.ledger.configure("D", 2)
        unsubscribe()
        f.probe("E", busy=0, total=1)
        self.assertEqual(heard, [A, "B", "D"])
        for _ in range(MAX_LISTENERS):
            f.ledger.subscribe(heard.append)
        self.assertRaises(ValueError, f.ledger.subscribe, heard.append)

    def test_recordsBounded(self) -> None:
        """More nodes than the bound: the least recently touched are forgotten."""
        f = Fixture(maxNodes=3)
        for i in range(10):
            f.ledger.configure(f"n{i}", 1)
        self.assertEqual(len(f.ledger.rooms), 3)
        self.assertIsNone(f.ledger.free("n0"))
        self.assertEqual(f.ledger.free("n9"), 1)
        f.ledger.forget("n9")
        self.assertIsNone(f.ledger.free("n9"))

    def test_serviceTime(self) -> None:
        """A moving average of how long ours hold a slot; absurd values are ignored."""
        f = Fixture()
        self.assertIsNone(f.ledger.serviceTime(A))
        f.ledger.finished(A, 2.0)
        f.ledger.finished(A, 6.0)
        f.ledger.finished(A, -1.0)
        f.ledger.finished(A, 1e9)
        self.assertEqual(f.ledger.serviceTime(A), 3.0)
        self.assertEqual(f.ledger.status(A)["serviceSeconds"], 3.0)


class SlotLimitsFollowerTests(SynchronousTestCase):
    """The fleet's backends give the ledger their limits, at start and on reload."""

    def test_followsTheFleet(self) -> None:
        """Each backend's ``max_concurrency`` is set; one no longer limited is cleared."""
        f = Fixture()
        limits = SlotLimits(f.ledger)
        verifyObject(IFleetFollower, limits)
        limits.setBackends([Backend("ollama", A, None, 4), Backend("ollama", "http://b:1")])
        self.assertEqual(f.ledger.capacity(A), 4)
        self.assertIsNone(f.ledger.capacity("http://b:1"))
        limits.setBackends([Backend("ollama", A)])
        self.assertIsNone(f.ledger.capacity(A))
