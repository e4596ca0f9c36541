"""The placement loop (spec §5.1): its three bounds (attempts, the job deadline, waiting for
an owner) and the driver that runs the policy through its waits."""

from __future__ import annotations

from nvpair.proxy.features import useStandalone
from nvpair.proxy.testing.fakecontext import FakeContext
from nvpair.proxy.testing.upstreamspy import UpstreamCall
from tests.support.exchangecase import LoopCase
from tests.support.fakerequest import FakeRequest
from tests.support.fakeupstream import makeFacade, node, setNodes


class BoundsTests(LoopCase):
    """The three bounds of §5.1: dispatch budget, job deadline, waiting for an owner."""

    settings = {"backoffBase": 1.0, "backoffMax": 4.0}

    def test_fastFailuresEndOnTheBudget(self) -> None:
        """Five fast failures over two owners: rounds back off 1, 2 s; the fifth answers."""
        ex, request = self.start()
        times = []
        for _ in range(5):
            self.assertEqual(len(self.upstream.pending()), 1)
            times.append(self.clock.seconds())
            self.upstream.pending()[0].answer(503, b"busy")
            self.clock.advance(0)
            for _ in range(10):
                if self.upstream.pending() or request.code is not None:
                    break
                self.clock.advance(0.5)
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B", "A", "B", "A"])
        self.assertEqual(times, [0.0, 0.0, 1.0, 1.0, 3.0])
        self.assertEqual(request.code, 503)
        self.assertEqual(request.body, b"busy", "the fifth attempt's own answer")
        self.assertIsNone(request.header(b"retry-after"))
        self.assertEqual(self.terminal()["state"], "failed")
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertReleased()

    def test_backoffCapped(self) -> None:
        """The wait between rounds doubles up to --backoff-max."""
        self.context = FakeContext(backoffBase=1.0, backoffMax=4.0, maxDispatchAttempts=10)
        self.clock, self.upstream = self.context.clock, self.context.upstream
        self.facade = makeFacade(self.clock, [node("A")])
        ex, request = self.start()
        times = []
        while request.code is None:
            times.append(self.clock.seconds())
            self.upstream.pending()[0].answer(500)
            while not self.upstream.pending() and request.code is None:
                self.clock.advance(0.5)
        self.assertEqual(times, [0, 1, 3, 7, 11, 15, 19, 23, 27, 31])

    def test_slowFailuresEndOnTheDeadline(self) -> None:
        """Attempts of 240 s each: the fourth would start past 600 s → 503, budget unspent."""
        self.context = FakeContext(responseHeaderTimeout=240.0)
        self.clock, self.upstream = self.context.clock, self.context.upstream
        self.facade = makeFacade(self.clock, [node("A")])
        ex, request = self.start()
        for _ in range(1000):
            if request.code is not None:
                break
            for call in self.upstream.pending():
                call.connect()
            self.clock.advance(1)
        self.assertEqual(len(self.upstream.calls), 3)
        self.assertGreaterEqual(self.clock.seconds(), 720)
        self.assertEqual(request.code, 503)
        self.assertEqual(self.errorReason(request), "deadline_exceeded")
        self.assertEqual(request.header(b"retry-after"), [b"10"])
        self.assertEqual(self.terminal()["state"], "failed")
        self.assertReleased()

    def test_deadlineNeverTruncatesAnAttempt(self) -> None:
        """An attempt started before the deadline runs to its first byte past it."""
        self.context = FakeContext(jobDeadline=10.0, backoffBase=9.0)
        self.clock, self.upstream = self.context.clock, self.context.upstream
        self.facade = makeFacade(self.clock, [node("A")])
        ex, request = self.start()
        self.upstream.last().answer(503)
        self.clock.advance(9.0)
        response = self.upstream.last().respond(200)
        self.clock.advance(100)
        response.send(b"x")
        response.end()
        self.assertEqual(request.code, 200)
        self.assertEqual(self.terminal()["state"], "completed")

    def test_waitingForOwnerCostsNoAttempt(self) -> None:
        """Owners gone after a dispatch: wait (no attempt spent); a new snapshot wakes early."""
        self.context = FakeContext(maxDispatchAttempts=2, backoffBase=1.0, backoffMax=4.0)
        self.clock, self.upstream = self.context.clock, self.context.upstream
        self.facade = makeFacade(self.clock, [node("A")])
        ex, request = self.start()
        setNodes(self.facade, [])  # A leaves: its attempt is abandoned, the wait begins
        self.assertTrue(self.upstream.last().cancelled)
        for _ in range(60):
            self.clock.advance(1)
        self.assertEqual(len(self.upstream.calls), 1)
        self.assertIsNone(request.code)
        self.clock.advance(0.5)
        setNodes(self.facade, [node("A")])  # wakes the wait at once
        self.assertEqual(len(self.upstream.calls), 2)
        self.assertEqual(self.clock.seconds(), 60.5)
        self.upstream.last().answer(503, b"own answer")
        self.assertEqual(request.code, 503)
        self.assertEqual(request.body, b"own answer", "the second dispatch was the final one")

    def test_noOwnerReturnsEndsOnDeadline(self) -> None:
        """No owner comes back: 503 owner_unavailable when the deadline passes."""
        ex, request = self.start()
        setNodes(self.facade, [])
        self.assertEqual(self.upstream.nodesCalled(), ["A"], "B left: never dispatched")
        for _ in range(700):
            if request.code is not None:
                break
            self.clock.advance(1)
        self.assertEqual(request.code, 503)
        self.assertEqual(self.errorReason(request), "owner_unavailable")
        self.assertEqual(self.clock.seconds(), 600)
        self.assertEqual(request.header(b"retry-after"), [b"10"])
        self.assertReleased()

    def test_roundsReResolve(self) -> None:
        """A node that gains the model mid-retry is tried in the next round."""
        ex, request = self.start()
        self.upstream.last().refuse()
        self.upstream.last().refuse()
        setNodes(self.facade, [node("A"), node("B"), node("C")])
        self.clock.advance(1.0)
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B", "A"])
        self.upstream.last().refuse()
        self.upstream.last().refuse()
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B", "A", "B", "C"])


class DriverTests(LoopCase):
    """The policy driver: waits that are over at once, and cancellation between waits."""

    nodes = tuple(f"N{i}" for i in range(3000))

    def test_immediateFailuresDoNotNest(self) -> None:
        """Thousands of candidates refused while their attempt starts are each tried once,
        in a loop rather than nested calls, and the last failure is answered."""
        self.upstream.auto = lambda call: call.refuse()
        request = FakeRequest(b"GET", b"/props")
        ex, request = self.start(request=request, inference=False, model=None, body=b"")
        self.assertEqual(len(self.upstream.calls), 3000)
        self.assertEqual(request.code, 502)
        self.assertEqual(self.errorReason(request), "upstream_unreachable")
        self.assertReleased()

    def test_clientGoneBetweenWaits(self) -> None:
        """A client lost while the policy runs between two waits (inside an attempt that
        fails at once) gets no further attempt: the next one is cancelled as it starts."""
        request = FakeRequest()

        def auto(call: UpstreamCall) -> None:
            if len(self.upstream.calls) == 1:
                request.lose()
                call.refuse()

        self.upstream.auto = auto
        ex, request = self.start(request=request)
        self.assertEqual(len(self.upstream.calls), 2)
        self.assertTrue(self.upstream.calls[1].cancelled)
        self.clock.advance(1000)
        self.assertEqual(len(self.upstream.calls), 2)
        self.assertEqual(self.terminal()["state"], "cancelled")
        self.assertIsNone(request.code)
        self.assertReleased()

    def test_crashInPolicyAnswers500(self) -> None:
        """An exception raised by the policy itself is answered 500 internal, reported
        once, and everything is released."""
        from nvpair.proxy.placement import policies as placement

        def boom(*a: object) -> None:
            raise ZeroDivisionError()

        self.patch(placement, "orderCandidates", boom)
        ex, request = self.start()
        self.assertEqual(request.code, 500)
        self.assertEqual(self.errorReason(request), "internal")
        self.assertEqual(self.context.record.internal, ["ZeroDivisionError"])
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)
        self.assertEqual(self.terminal()["state"], "failed")
        self.assertEqual(self.upstream.calls, [])
        self.assertReleased()


class OrderingCacheTests(LoopCase):
    """A round orders the snapshot's own owner tuple while no owner is known full, so the
    ordering cached on it serves every request (standalone's queue and breakers on)."""

    def test_ownerOrderingReused(self) -> None:
        """Two requests in turn: both rounds order through the one cached plan."""
        useStandalone(self.context, affinity=False)
        owners = self.facade.snapshot.owners("m1", self.facade.hasLocalBackend)
        self.start()
        plan = owners.plan  # type: ignore[attr-defined]
        self.assertIsNotNone(plan)
        self.start()
        self.assertIs(owners.plan, plan)  # type: ignore[attr-defined]
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B"])
