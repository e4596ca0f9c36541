"""The fleet file's ``max_concurrency`` in the engine states (``EngineStates.setLimit``): the
slots of an engine that reports none, bounded, and followed across reloads."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nvpair.proxy.facade.fleetfile import Backend
from nvpair.proxy.facade.reload import IFleetFollower
from nvpair.proxy.facade.standalone import SlotLimits
from nvpair.proxy.nodestate.probes import EngineReport
from nvpair.proxy.nodestate.states import EngineStates
from nvpair.proxy.routing.reservations import ReservationMap

A = "http://a:1"


class SlotLimitTests(SynchronousTestCase):
    """A configured limit stands in for the slots an engine does not report."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.reservations = ReservationMap()
        self.states = EngineStates(self.clock, self.reservations, maxNodes=4)

    def test_limitWithoutProbe(self) -> None:
        """Never probed (or reporting no slots): the limit is the total, and what is free is
        the limit less our live reservations."""
        self.states.setLimit(A, 2)
        self.assertEqual(self.states.totalSlots(A), 2)
        self.assertEqual(self.states.availableSlots(A), 2)
        first = self.reservations.reserve(A)
        self.assertEqual(self.states.availableSlots(A), 1)
        self.reservations.reserve(A)
        self.assertEqual(self.states.roomAndLoaded(A, "m"), (0, None))
        first.release()
        self.assertEqual(self.states.availableSlots(A), 1)
        self.assertIsNone(self.states.freeSlots(A))  # nothing was reported

    def test_reportedSlotsWin(self) -> None:
        """An engine that reports its slots is read as it reports them."""
        self.states.setLimit(A, 2)
        self.states.record(A, EngineReport(busy=1, total=8), 1.0, "/slots")
        self.assertEqual(self.states.totalSlots(A), 8)
        self.assertEqual(self.states.availableSlots(A), 7)
        self.clock.advance(5.0)  # stale: unknown, and the limit stands in again
        self.assertEqual(self.states.totalSlots(A), 2)
        self.assertEqual(self.states.availableSlots(A), 2)

    def test_loadedStillRead(self) -> None:
        """A probe that reports loaded models but no slots: loaded from the probe, room from
        the limit."""
        self.states.setLimit(A, 1)
        self.states.record(A, EngineReport(loaded=frozenset({"m"})), 1.0, "/api/ps")
        self.assertEqual(self.states.roomAndLoaded(A, "m"), (1, True))
        self.assertEqual(self.states.roomAndLoaded(A, "x"), (1, False))

    def test_clearedAndForgotten(self) -> None:
        """No limit (None), or the backend gone: nothing is known."""
        self.states.setLimit(A, 3)
        self.states.setLimit(A, None)
        self.assertIsNone(self.states.totalSlots(A))
        self.states.setLimit(A, 3)
        self.states.forget(A)
        self.assertIsNone(self.states.availableSlots(A))

    def test_bounded(self) -> None:
        """More limits than nodes kept: the rest are ignored; a kept one still changes."""
        for i in range(10):
            self.states.setLimit(f"http://n{i}:1", i + 1)
        self.assertEqual(len(self.states.limits), 4)
        self.assertIsNone(self.states.totalSlots("http://n9:1"))
        self.states.setLimit("http://n0:1", 7)
        self.assertEqual(self.states.totalSlots("http://n0:1"), 7)

    def test_status(self) -> None:
        """``/status`` shows the limit beside what the probes say."""
        self.states.setLimit(A, 2)
        self.assertEqual(self.states.status()[A], {"state": "unknown", "slotsLimit": 2})


class SlotLimitsFollowerTests(SynchronousTestCase):
    """The fleet's backends give the engine states their limits, at start and on reload."""

    def test_followsTheFleet(self) -> None:
        """Each backend's ``max_concurrency`` is set; one no longer limited is cleared."""
        states = EngineStates(Clock(), ReservationMap())
        limits = SlotLimits(states)
        verifyObject(IFleetFollower, limits)
        limits.setBackends([Backend("ollama", A, None, 4), Backend("ollama", "http://b:1")])
        self.assertEqual(states.totalSlots(A), 4)
        self.assertIsNone(states.totalSlots("http://b:1"))
        limits.setBackends([Backend("ollama", A)])
        self.assertIsNone(states.totalSlots(A))
