"""Failing over (spec §5, §5.3, §5.4): the final attempt answers for itself, candidates in
order, targets that leave discovery, and the verbatim policy's single round."""

from __future__ import annotations

from nvpair.proxy.testing.fakecontext import FakeContext
from tests.support.exchangecase import LoopCase
from tests.support.fakerequest import FakeRequest
from tests.support.fakeupstream import (
    makeFacade,
    node,
    setNodes,
)


class FinalAttemptTests(LoopCase):
    """The final permitted attempt answers for itself (§5.4)."""

    settings = {"maxDispatchAttempts": 2, "responseHeaderTimeout": 30.0}

    def test_finalStatusPassedThrough(self) -> None:
        """Two 503s with a budget of two: the second 503 and its body reach the client."""
        ex, request = self.start()
        self.upstream.last().respond(503)
        final = self.upstream.last().respond(
            503, {b"content-type": [b"application/json"], b"retry-after": [b"7"]}
        )
        final.send(b'{"error":"busy"}')
        final.end()
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B"])
        self.assertEqual(request.code, 503)
        self.assertEqual(request.body, b'{"error":"busy"}')
        self.assertEqual(request.header(b"retry-after"), [b"7"])
        self.assertEqual(self.terminal()["state"], "failed")
        self.assertReleased()

    def test_finalTransportFailure502(self) -> None:
        """The final attempt refused at the transport: 502 upstream_unreachable."""
        ex, request = self.start()
        self.upstream.last().refuse()
        self.upstream.last().refuse()
        self.assertEqual(request.code, 502)
        self.assertEqual(self.errorReason(request), "upstream_unreachable")
        self.assertEqual(self.terminal()["state"], "failed")
        self.assertReleased()

    def test_finalNoContent504(self) -> None:
        """The final attempt sends headers then nothing: 504 no_content, never committed."""
        ex, request = self.start()
        self.upstream.last().refuse()
        response = self.upstream.last().respond(200)
        self.clock.advance(29)
        self.assertIsNone(request.code)
        self.clock.advance(1)
        self.assertEqual(request.code, 504)
        self.assertEqual(self.errorReason(request), "no_content")
        self.clock.advance(0)
        self.assertTrue(response.transport.stopped)
        response.send(b"late")
        self.assertNotIn(b"late", request.body)
        self.assertEqual(self.terminal()["state"], "failed")
        self.assertReleased()

    def test_finalHeaderTimeout502(self) -> None:
        """The final attempt connects and never answers headers: 502, the request cancelled."""
        ex, request = self.start()
        self.upstream.last().refuse()
        call = self.upstream.last().connect()
        self.clock.advance(30)
        self.assertTrue(call.cancelled)
        self.assertEqual(request.code, 502)
        self.assertEqual(self.errorReason(request), "upstream_unreachable")

    def test_headerTimerStartsAfterDial(self) -> None:
        """The header cap is measured from the end of the dial, not from the request."""
        ex, request = self.start()
        call = self.upstream.last()
        self.clock.advance(25)
        call.connect()
        self.clock.advance(29)
        self.assertFalse(call.cancelled)
        self.clock.advance(1)
        self.assertTrue(call.cancelled)

    def test_finalRetryableStatusWithNoBody504(self) -> None:
        """A final 503 whose body never comes is still a no-content attempt: 504."""
        ex, request = self.start()
        self.upstream.last().refuse()
        self.upstream.last().respond(503)
        self.clock.advance(30)
        self.assertEqual(request.code, 504)


class OrderTests(LoopCase):
    """Candidate order: eligible pin, scheduler order, default (self, then id)."""

    nodes = ("A", "B", "C")

    def test_defaultOrder(self) -> None:
        """With no pin and no scheduler snapshot: by id (after reservations spread)."""
        self.start()
        self.assertEqual(self.upstream.nodesCalled(), ["A"])

    def test_schedulerOrder(self) -> None:
        """The scheduler's order is followed in failover."""
        self.context.reservations.applyPriority(1, ["C", "A", "B"], {})
        self.start()
        for _ in range(2):
            self.upstream.last().refuse()
        self.assertEqual(self.upstream.nodesCalled(), ["C", "A", "B"])

    def test_pinFirstNoReservation(self) -> None:
        """An eligible pin goes first and takes no reservation."""
        self.context.reservations.applyPriority(1, ["C", "A", "B"], {})
        self.facade.pin = "B"
        self.start()
        self.assertEqual(self.upstream.nodesCalled(), ["B"])
        self.assertEqual(self.context.reservations.totalReserved(), 0)
        self.upstream.last().refuse()
        self.assertEqual(self.upstream.nodesCalled(), ["B", "C"])

    def test_ineligiblePinNeverOverrides(self) -> None:
        """A pin on a node that does not own the model changes nothing and is never contacted."""
        setNodes(self.facade, [node("A"), node("B"), node("X", models=("other",))])
        self.facade.pin = "X"
        self.start()
        self.upstream.last().refuse()
        self.upstream.last().refuse()
        self.clock.advance(10)
        self.assertNotIn("X", self.upstream.nodesCalled())


class LeaveDiscoveryTests(LoopCase):
    """A target that leaves discovery is abandoned at once; commit wins the race (§5.3)."""

    def test_leavingCancelsPendingAttempt(self) -> None:
        """A pending request to A is cancelled when A leaves; B is tried at once."""
        ex, request = self.start()
        call = self.upstream.last().connect()
        setNodes(self.facade, [node("B")])
        self.assertTrue(call.cancelled)
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B"])
        self.assertEqual(self.context.record.failedAttempts[-1].kind, "left")
        self.upstream.last().answer(200, b"x")
        self.assertEqual(request.body, b"x")

    def test_leavingAfterHeadersStopsBody(self) -> None:
        """Headers in, A leaves before the first byte: its body is stopped, B serves."""
        ex, request = self.start()
        response = self.upstream.last().respond(200)
        setNodes(self.facade, [node("B")])
        self.assertTrue(response.transport.stopped)
        response.send(b"late byte")  # the watcher claimed first: the byte commits nothing
        self.clock.advance(0)
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B"])
        self.upstream.last().answer(200, b"fromB")
        self.assertEqual(request.body, b"fromB")
        self.assertEqual(self.terminal()["scheduledOn"], "B")

    def test_commitWinsOverLeaving(self) -> None:
        """The first byte arrives, then A leaves discovery: the stream continues on A."""
        ex, request = self.start()
        response = self.upstream.last().respond(200)
        response.send(b"one")
        setNodes(self.facade, [node("B")])
        self.assertFalse(response.transport.stopped)
        response.send(b"two")
        response.end()
        self.assertEqual(request.body, b"onetwo")
        self.assertEqual(self.upstream.nodesCalled(), ["A"])
        self.assertEqual(self.terminal()["state"], "completed")

    def test_staleCandidateSkipped(self) -> None:
        """A candidate of the round that left meanwhile is not dispatched to."""
        setNodes(self.facade, [node("A"), node("B"), node("C")])
        ex, request = self.start()
        call = self.upstream.last()
        setNodes(self.facade, [node("A"), node("C")])
        call.refuse()
        self.assertEqual(self.upstream.nodesCalled(), ["A", "C"])

    def test_finalAttemptLeaving(self) -> None:
        """The final attempt's target leaves: nothing answered, so 502 upstream_unreachable."""
        self.context = FakeContext(maxDispatchAttempts=1)
        self.clock, self.upstream = self.context.clock, self.context.upstream
        self.facade = makeFacade(self.clock, [node("A"), node("B")])
        ex, request = self.start()
        setNodes(self.facade, [node("B")])
        self.assertEqual(request.code, 502)
        self.assertEqual(self.terminal()["state"], "failed")


class VerbatimTests(LoopCase):
    """Non-inference routes: one round, each candidate at most once, no backoff (§5.1)."""

    nodes = ("A", "B", "C")

    def test_pullNeverTwiceOnOneNode(self) -> None:
        """A POST /api/pull meeting a different 5xx on each node: each node once, the last
        answer passed."""
        self.facade = makeFacade(
            self.clock, [node(n, models=("llama3:latest",)) for n in self.nodes], engine="ollama"
        )
        request = FakeRequest(b"POST", b"/api/pull")
        ex, request = self.start(
            request=request, inference=False, model="llama3:latest", body=b'{"model":"llama3"}'
        )
        for status in (500, 502, 500):
            self.upstream.last().answer(status, b"e")
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B", "C"])
        self.assertEqual(request.code, 500)
        self.clock.advance(10000)
        self.assertEqual(len(self.upstream.calls), 3)
        self.assertEqual(self.events(), [], "not a workload")
        self.assertReleased()

    def test_headersCommitVerbatim(self) -> None:
        """The first-byte gate is for inference: verbatim headers commit."""
        request = FakeRequest(b"GET", b"/props")
        ex, request = self.start(request=request, inference=False, model=None, body=b"")
        response = self.upstream.last().respond(200)
        self.assertEqual(request.code, 200)
        self.clock.advance(100000)
        response.send(b"late")
        response.end()
        self.assertEqual(request.body, b"late")
        self.assertEqual(self.context.reservations.totalReserved(), 0)

    def test_noDeadline(self) -> None:
        """Slow failures on a verbatim route are not cut by the job deadline."""
        self.context = FakeContext(responseHeaderTimeout=400.0)
        self.clock, self.upstream = self.context.clock, self.context.upstream
        self.facade = makeFacade(self.clock, [node(n) for n in self.nodes])
        request = FakeRequest(b"GET", b"/props")
        ex, request = self.start(request=request, inference=False, model=None, body=b"")
        for _ in range(3):
            self.upstream.last().connect()
            self.clock.advance(400)
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B", "C"])
        self.assertEqual(request.code, 502)

    def test_modelNamedButUnowned(self) -> None:
        """A verbatim body naming a model nobody has goes to every node in order."""
        request = FakeRequest(b"POST", b"/other")
        ex, request = self.start(request=request, inference=False, model="zzz", body=b"{}")
        self.assertEqual(self.upstream.nodesCalled(), ["A"])


class SameFailureTests(LoopCase):
    """A request that fails the same way on two nodes is the request's fault: the second
    node's answer is the answer (spec §6 "Status handling")."""

    nodes = ("A", "B", "C")

    def test_sameStatusOnTwoNodesAnswers(self) -> None:
        """500 from A, then 500 from B: B's answer is passed on, C is never tried."""
        ex, request = self.start()
        self.upstream.last().answer(500, b"first")
        self.upstream.last().answer(500, b'{"error":"bad tool schema"}')
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B"])
        self.assertEqual((request.code, request.body), (500, b'{"error":"bad tool schema"}'))
        self.assertEqual(self.terminal()["state"], "failed")
        self.assertReleased()

    def test_otherFailuresGoOn(self) -> None:
        """A 500 then a 502 (not the same way), or 503s (busy, whatever is asked), or the
        same 500 from the same node again: retried as before."""
        ex, request = self.start()
        self.upstream.last().answer(500)
        self.upstream.last().answer(502)
        self.upstream.last().answer(200, b"{}")
        self.assertEqual((self.upstream.nodesCalled(), request.code), (["A", "B", "C"], 200))
        self.facade = makeFacade(self.clock, [node("A"), node("B")])
        ex, request = self.start()
        self.upstream.last().answer(503)
        self.upstream.last().answer(503)
        self.assertIsNone(request.code)
        self.facade = makeFacade(self.clock, [node("A")])
        ex, request = self.start()
        self.upstream.last().answer(500)
        self.clock.advance(self.context.settings.backoffBase)
        self.upstream.last().answer(500)
        self.assertIsNone(request.code)
