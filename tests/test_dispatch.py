"""Deterministic tests of the dispatch loop (spec §5, §5.1, §5.3-§5.5, §6) on a Clock.

Every upstream attempt is a scripted ``Call`` of ``FakeUpstream``; the client is a
``FakeRequest``; the context records workload events, node activity and reservations.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.routing.reservations import NodeLoad
from tests.fakecontext import FakeContext
from tests.fakeupstream import (
    RUN_ID,
    FakeRequest,
    FakeResponse,
    makeFacade,
    node,
    setNodes,
    startExchange,
)

SSE = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
USAGE = (
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\ndata: [DONE]\n\n'
)


class LoopCase(SynchronousTestCase):
    """Shared setup: a context on a Clock and a facade with owners A and B of ``m1``."""

    nodes: tuple[str, ...] = ("A", "B")
    settings: dict[str, Any] = {}

    def setUp(self) -> None:
        self.context = FakeContext(**self.settings)
        self.clock = self.context.clock
        self.upstream = self.context.upstream
        self.facade = makeFacade(self.clock, [node(n) for n in self.nodes])

    def start(self, **kw: Any) -> tuple[Any, FakeRequest]:
        return startExchange(self.context, self.facade, **kw)

    def events(self) -> list[tuple[str, dict[str, Any]]]:
        return self.context.sink.workloadEvents()

    def shape(self) -> list[tuple[str, str, str | None]]:
        """(method, state, scheduledOn) per workload event."""
        return [(m, i["state"], i.get("scheduledOn")) for m, i in self.events()]

    def terminal(self) -> dict[str, Any]:
        ends = [i for m, i in self.events() if m in ("workload:completed", "workload:errored")]
        self.assertEqual(len(ends), 1, "exactly one terminal event")
        return ends[0]

    def assertReleased(self) -> None:
        """Nothing of the request is left behind: reservations, in-flight counts, exchanges."""
        self.assertEqual(self.context.reservations.totalReserved(), 0)
        self.assertEqual(self.context.activity.inFlight, {})
        self.assertEqual(self.context.exchanges, set())
        self.assertEqual(len(self.context.record.ended), 1)

    def errorReason(self, request: FakeRequest) -> str:
        return str(json.loads(request.body)["error"]["code"])


class HappyPathTests(LoopCase):
    """A first attempt that commits and streams to the end."""

    def test_streamsExactBytesAndReports(self) -> None:
        """The client gets the upstream status, headers and bytes; events follow §5.5."""
        ex, request = self.start()
        call = self.upstream.last()
        self.assertEqual(call.nodeId, "A")
        response = call.respond(
            200,
            {
                b"content-type": [b"text/event-stream"],
                b"x-engine": [b"yes"],
                b"connection": [b"close"],
            },
        )
        self.assertIsNone(request.code, "headers alone commit nothing")
        response.send(SSE[:3], SSE[3:], USAGE)
        self.assertEqual(request.code, 200)
        self.assertEqual(request.header(b"x-engine"), [b"yes"])
        self.assertIsNone(request.header(b"connection"))
        self.assertEqual(request.header(b"x-nvpair-node"), [b"A"])
        response.end()
        self.assertEqual(request.body, SSE + USAGE)
        self.assertTrue(request.finished)
        self.assertEqual(
            self.shape(),
            [
                ("workload:submitted", "queued", None),
                ("workload:submitted", "queued", "A"),
                ("workload:started", "running", "A"),
                ("workload:completed", "completed", "A"),
            ],
        )
        infos = [i for _, i in self.events()]
        self.assertEqual([i["seq"] for i in infos], [1, 2, 3, 4])
        self.assertEqual({i["runId"] for i in infos}, {RUN_ID})
        self.assertEqual({i["id"] for i in infos}, {"1"})
        self.assertNotIn("startedAt", infos[1])
        self.assertIn("startedAt", infos[2])
        self.assertEqual(infos[3]["stats"]["promptTokens"], 3)
        self.assertEqual(infos[3]["stats"]["completionTokens"], 2)
        self.assertEqual(self.context.sink.activity(), [("A", 1), ("A", 0)])
        self.assertReleased()

    def test_answeredBeforeTheLoopWaits(self) -> None:
        """An upstream whose whole answer arrives while the attempt starts (before the loop
        awaits it) is served and reported exactly once."""
        clock = self.clock

        class Immediate(FakeResponse):
            def deliverBody(self, protocol: Any) -> None:
                super().deliverBody(protocol)
                self.send(SSE, USAGE)
                self.end()

        def auto(call: Any) -> None:
            call.connect()
            call.response = Immediate(clock, 200)
            call.deferred.callback(call.response)

        self.upstream.auto = auto
        ex, request = self.start()
        self.assertEqual(request.code, 200)
        self.assertEqual(request.body, SSE + USAGE)
        self.assertTrue(request.finished)
        self.assertEqual(
            [m for m, _, _ in self.shape()][-2:], ["workload:started", "workload:completed"]
        )
        self.assertEqual(self.terminal()["state"], "completed")
        self.assertIsNone(ex.serving)
        self.assertReleased()

    def test_eofWithoutBodyCommits(self) -> None:
        """An upstream that answers 200 and ends with no body commits (§5.2)."""
        ex, request = self.start()
        response = self.upstream.last().respond(200, length=0)
        response.end()
        self.assertEqual(request.code, 200)
        self.assertTrue(request.finished)
        self.assertEqual(request.body, b"")
        self.assertEqual(self.terminal()["state"], "completed")
        self.assertEqual(len(self.upstream.calls), 1)

    def test_forwardsRequest(self) -> None:
        """Method, path with query, body and end-to-end headers are forwarded; hop-by-hop not."""
        request = FakeRequest(
            path=b"/v1/chat/completions?x=1",
            headers={
                b"content-type": [b"application/json"],
                b"authorization": [b"Bearer k"],
                b"connection": [b"keep-alive, x-hop"],
                b"x-hop": [b"1"],
                b"host": [b"proxy"],
                b"keep-alive": [b"5"],
                b"te": [b"trailers"],
                b"expect": [b"100-continue"],
            },
        )
        self.start(request=request, body=b'{"model":"m1"}')
        call = self.upstream.last()
        self.assertEqual(
            (call.method, call.path, call.body),
            (b"POST", b"/v1/chat/completions?x=1", b'{"model":"m1"}'),
        )
        names = {n.lower() for n, _ in call.headers.getAllRawHeaders()}
        self.assertEqual(names, {b"content-type", b"authorization"})
        self.assertEqual(call.address, "http://A")


class NoOwnerTests(LoopCase):
    """No owner at admission answers 502 at once (§5.1, §5.4)."""

    def test_noOwnerAtAdmission(self) -> None:
        """An unadvertised model contacts no engine; submitted then errored(no_owner)."""
        ex, request = self.start(model="unknown", body=b'{"model":"unknown"}')
        self.assertEqual(self.upstream.calls, [])
        self.assertEqual(request.code, 502)
        self.assertEqual(self.errorReason(request), "no_owner")
        self.assertEqual(
            self.shape(),
            [("workload:submitted", "queued", None), ("workload:errored", "failed", None)],
        )
        self.assertEqual(self.terminal()["error"], "no_owner")
        self.assertReleased()

    def test_selfWithoutLocalBackendIsNoOwner(self) -> None:
        """A self node is a candidate only once a local backend is known."""
        setNodes(self.facade, [node("S", isSelf=True)])
        ex, request = self.start()
        self.assertEqual(request.code, 502)
        self.assertEqual(self.upstream.calls, [])

    def test_selfUsesLocalBackend(self) -> None:
        """A self node is reached through the local backend, before other owners."""
        setNodes(self.facade, [node("B"), node("S", isSelf=True)])
        self.facade.setLocalBackend("http://127.0.0.1:9")
        self.start()
        self.assertEqual(self.upstream.last().address, "http://127.0.0.1:9")
        self.assertEqual(self.upstream.last().nodeId, "S")


class StatusTableTests(LoopCase):
    """The §5.4 status table, pre-commit with budget remaining."""

    def failover(self, status: int) -> tuple[FakeRequest, Any]:
        ex, request = self.start()
        first = self.upstream.last().respond(status, {b"content-type": [b"application/json"]})
        return request, first

    def test_retriedStatuses(self) -> None:
        """404 (inference), 408, 429 and every 5xx fail over to the next owner."""
        for status in (404, 408, 429, 500, 502, 503, 504, 599):
            self.setUp()
            request, first = self.failover(status)
            self.assertIsNone(request.code, status)
            self.assertEqual(self.upstream.nodesCalled(), ["A", "B"], status)
            self.upstream.last().answer(200, SSE)
            self.assertEqual(request.code, 200, status)
            self.assertEqual(request.body, SSE)
            self.assertEqual(self.terminal()["state"], "completed")
            self.assertEqual(self.terminal()["scheduledOn"], "B")
            self.assertReleased()

    def test_answerStatuses(self) -> None:
        """3xx and 4xx other than 404/408/429 are the answer at once, whatever budget is left."""
        for status in (301, 302, 400, 401, 403, 405, 409, 413, 422):
            self.setUp()
            request, first = self.failover(status)
            first.send(b'{"error":"x"}')
            first.end()
            self.assertEqual(self.upstream.nodesCalled(), ["A"], status)
            self.assertEqual(request.code, status)
            self.assertEqual(request.body, b'{"error":"x"}')
            info = self.terminal()
            self.assertEqual(info["state"], "failed", status)
            if status >= 400:
                self.assertNotIn("stats", info, "error bodies are never measured")
            self.assertReleased()

    def test_committedSuccessCompleted(self) -> None:
        """Every 2xx commits and completes."""
        for status in (200, 201, 204):
            self.setUp()
            ex, request = self.start()
            self.upstream.last().answer(status, b"x")
            self.assertEqual(self.terminal()["state"], "completed")
            self.assertEqual(request.code, status)

    def test_transportErrorFailsOverAndForgetsAddress(self) -> None:
        """A refused dial fails over, and the node's confirmed address is forgotten."""
        self.facade.confirmed["A"] = "http://A"
        ex, request = self.start()
        self.upstream.last().refuse()
        self.assertNotIn("A", self.facade.confirmed)
        self.upstream.last().answer(200, SSE)
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B"])
        self.assertEqual(self.facade.confirmed.get("B"), "http://B")
        self.assertEqual(request.code, 200)

    def test_dropBeforeHeadersFailsOver(self) -> None:
        """A connection lost before headers is a transport error: fail over."""
        ex, request = self.start()
        self.upstream.last().drop()
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B"])

    def test_dropAfterHeadersFailsOver(self) -> None:
        """Headers then a dead connection before any byte: not committed, fail over."""
        ex, request = self.start()
        self.upstream.last().respond(200).fail()
        self.assertIsNone(request.code)
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B"])

    def test_404VerbatimIsAnswer(self) -> None:
        """On a non-inference route a 404 is the answer, not retried."""
        ex, request = self.start(
            inference=False, model=None, request=FakeRequest(b"GET", b"/props"), body=b""
        )
        self.upstream.last().answer(404, b"nf")
        self.assertEqual(self.upstream.nodesCalled(), ["A"])
        self.assertEqual(request.code, 404)


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


class HeaderIsNotCommitTests(LoopCase):
    """Headers alone commit nothing; the first-content cap fails over (§5.2)."""

    settings = {"responseHeaderTimeout": 2.0}

    def test_headersThenSilenceFailsOver(self) -> None:
        """A: headers and silence past the cap → B serves; A's body is stopped."""
        ex, request = self.start()
        first = self.upstream.last().respond(200)
        self.clock.advance(1.9)
        self.assertEqual(len(self.upstream.calls), 1)
        self.clock.advance(0.1)
        self.assertTrue(first.transport.stopped)
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B"])
        self.upstream.last().answer(200, SSE)
        self.assertEqual(request.body, SSE)
        self.assertEqual(request.header(b"x-nvpair-node"), [b"B"])
        self.assertEqual(
            self.shape(),
            [
                ("workload:submitted", "queued", None),
                ("workload:submitted", "queued", "A"),
                ("workload:submitted", "queued", None),
                ("workload:submitted", "queued", "B"),
                ("workload:started", "running", "B"),
                ("workload:completed", "completed", "B"),
            ],
        )

    def test_zeroDisablesCaps(self) -> None:
        """--response-header-timeout 0 disables both caps."""
        self.context = FakeContext(responseHeaderTimeout=0.0)
        self.clock = self.context.clock
        self.upstream = self.context.upstream
        self.facade = makeFacade(self.clock, [node("A"), node("B")])
        ex, request = self.start()
        call = self.upstream.last().connect()
        self.clock.advance(100000)
        self.assertFalse(call.cancelled)
        response = call.respond(200)
        self.clock.advance(100000)
        response.send(b"x")
        self.assertEqual(request.code, 200)

    def test_slowFirstByteWithinCapCommits(self) -> None:
        """A first byte just inside the cap commits on that node."""
        ex, request = self.start()
        response = self.upstream.last().respond(200)
        self.clock.advance(1.99)
        response.send(b"x")
        response.end()
        self.assertEqual(self.upstream.nodesCalled(), ["A"])
        self.assertEqual(request.body, b"x")


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


class CancellationTests(LoopCase):
    """Client disconnect, the dead-client deadline, shutdown, mid-copy failure (§5.3, §5.4)."""

    settings = {"clientWriteTimeout": 5.0}

    def test_clientGoneBeforeCommit(self) -> None:
        """The client leaves while A is pending: A is cancelled, nothing more is tried."""
        ex, request = self.start()
        call = self.upstream.last().connect()
        request.lose()
        self.assertTrue(call.cancelled)
        self.clock.advance(1000)
        self.assertEqual(len(self.upstream.calls), 1)
        info = self.terminal()
        self.assertEqual(info["state"], "cancelled")
        self.assertReleased()

    def test_clientGoneDuringBackoff(self) -> None:
        """The client leaves between rounds: no further attempt, cancelled."""
        ex, request = self.start()
        self.upstream.last().refuse()
        self.upstream.last().refuse()
        self.assertEqual(self.context.reservations.totalReserved(), 0, "released before backoff")
        request.lose()
        self.clock.advance(1000)
        self.assertEqual(len(self.upstream.calls), 2)
        self.assertEqual(self.terminal()["state"], "cancelled")
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertReleased()

    def test_clientGoneAfterHeadersStopsUpstream(self) -> None:
        """Headers in, client leaves: the upstream body is stopped (engine sees a close)."""
        ex, request = self.start()
        response = self.upstream.last().respond(200)
        request.lose()
        self.assertTrue(response.transport.stopped)
        self.assertEqual(self.terminal()["state"], "cancelled")
        self.assertReleased()

    def test_clientGoneMidStream(self) -> None:
        """After commit the client leaves: upstream stopped, workload cancelled, once."""
        ex, request = self.start()
        response = self.upstream.last().respond(200)
        response.send(SSE)
        request.lose()
        self.assertTrue(response.transport.stopped)
        self.clock.advance(0)
        self.assertEqual(self.shape()[-1], ("workload:errored", "cancelled", "A"))
        self.assertNotIn("stats", self.terminal())
        self.assertReleased()

    def test_clientGoneAfterWholeStream(self) -> None:
        """The client hangs up after ``data: [DONE]`` but before the engine ends the body: the
        answer was delivered whole, so the workload is completed, with its statistics."""
        ex, request = self.start()
        response = self.upstream.last().respond(200)
        response.send(SSE + USAGE)
        request.lose()
        self.assertTrue(response.transport.stopped)
        self.clock.advance(0)
        self.assertEqual(self.shape()[-1], ("workload:completed", "completed", "A"))
        self.assertEqual(self.terminal()["stats"]["completionTokens"], 2)
        self.assertReleased()

    def test_clientGoneAfterWholeLengthBody(self) -> None:
        """A non-streamed answer whose Content-Length was all passed on is completed even if
        the client closes before the upstream signals the end."""
        ex, request = self.start()
        body = b'{"choices":[{"message":{"content":"hi"}}]}'
        response = self.upstream.last().respond(200, length=len(body))
        response.send(body)
        request.lose()
        self.clock.advance(0)
        self.assertEqual(self.terminal()["state"], "completed")

    def test_clientGoneShortOfLength(self) -> None:
        """A client that leaves before the whole Content-Length arrived is cancelled."""
        ex, request = self.start()
        response = self.upstream.last().respond(200, length=100)
        response.send(b"x" * 99)
        request.lose()
        self.clock.advance(0)
        self.assertEqual(self.terminal()["state"], "cancelled")

    def test_backpressureAndDeadClient(self) -> None:
        """A paused client pauses the upstream; past the write deadline it is cut: cancelled."""
        ex, request = self.start()
        response = self.upstream.last().respond(200)
        response.send(b"x")
        request.pause()
        self.assertTrue(response.transport.paused)
        self.clock.advance(4)
        request.resume()
        self.assertFalse(response.transport.paused)
        request.pause()
        self.clock.advance(4.9)
        self.assertFalse(request.aborted)
        self.clock.advance(0.1)
        self.assertTrue(request.aborted)
        self.assertTrue(response.transport.stopped)
        self.assertEqual(self.terminal()["state"], "cancelled")
        self.assertReleased()

    def test_midCopyFailureTruncates(self) -> None:
        """The node dies after commit: relayed bytes flushed, connection closed; completed."""
        ex, request = self.start()
        response = self.upstream.last().respond(200)
        response.send(SSE)
        response.fail()
        self.assertTrue(request.closed)
        self.assertFalse(request.aborted)
        self.assertFalse(request.finished)
        self.assertEqual(request.body, SSE)
        self.assertEqual(self.terminal()["state"], "completed")
        self.assertEqual(len(self.upstream.calls), 1, "never retried after commit")
        self.assertReleased()

    def test_shutdownCancelsInFlight(self) -> None:
        """Shutdown cancels a pending attempt and a streaming one; both end cancelled."""
        ex1, r1 = self.start()
        ex2, r2 = self.start()
        pending = self.upstream.calls[0]
        streaming = self.upstream.calls[1].respond(200)
        streaming.send(b"x")
        for ex in list(self.context.exchanges):
            ex.shutdown()
        self.clock.advance(0)
        self.assertTrue(pending.cancelled)
        self.assertTrue(streaming.transport.stopped)
        ends = [i["state"] for m, i in self.events() if m == "workload:errored"]
        self.assertEqual(ends, ["cancelled", "cancelled"])
        self.assertEqual(self.context.reservations.totalReserved(), 0)
        self.assertEqual(self.context.activity.inFlight, {})

    def test_internalErrorReleases(self) -> None:
        """An unexpected exception: 500 internal, workload failed, everything released."""
        ex, request = self.start()

        def boom(*a: Any) -> None:
            raise ZeroDivisionError()

        self.patch(type(ex), "writeHead", boom)
        response = self.upstream.last().respond(200)
        response.send(b"x")
        self.clock.advance(0)
        self.assertEqual(request.code, 500)
        self.assertEqual(self.context.record.internal, ["ZeroDivisionError"])
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)
        self.assertEqual(self.terminal()["state"], "failed")
        self.assertTrue(response.transport.stopped)
        self.assertReleased()


class VerbatimTests(LoopCase):
    """Non-inference routes: one round, each candidate at most once, no backoff (§5.1)."""

    nodes = ("A", "B", "C")

    def test_pullNeverTwiceOnOneNode(self) -> None:
        """A POST /api/pull meeting 5xx everywhere: each node once, the last answer passed."""
        self.facade = makeFacade(
            self.clock, [node(n, models=("llama3:latest",)) for n in self.nodes], engine="ollama"
        )
        request = FakeRequest(b"POST", b"/api/pull")
        ex, request = self.start(
            request=request, inference=False, model="llama3:latest", body=b'{"model":"llama3"}'
        )
        for _ in range(3):
            self.upstream.last().answer(500, b"e")
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


class ReservationTests(LoopCase):
    """Reservations: least-loaded listed candidate, moved per attempt, released always (§6)."""

    nodes = ("A", "B", "C")

    def prioritize(self, load: dict[str, int] | None = None) -> None:
        load = load or {}
        self.context.reservations.applyPriority(
            1, ["A", "B", "C"], {n: NodeLoad(load.get(n, 0), 0.0) for n in self.nodes}
        )

    def test_leastLoadedFirst(self) -> None:
        """The least-loaded listed candidate is reserved and tried first; ties keep order."""
        self.prioritize({"A": 2, "B": 1, "C": 1})
        self.start()
        self.assertEqual(self.upstream.nodesCalled(), ["B"])
        self.assertEqual(self.context.reservations.byNode(), {"B": 1})
        self.start()
        self.assertEqual(self.upstream.nodesCalled(), ["B", "C"])
        self.start()
        self.assertEqual(self.upstream.nodesCalled(), ["B", "C", "A"], "a tie keeps order")

    def test_concurrentSpread(self) -> None:
        """Equal load: concurrent requests spread A, B, C, A, ..."""
        self.prioritize()
        for _ in range(6):
            self.start()
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B", "C", "A", "B", "C"])
        self.assertEqual(self.context.reservations.byNode(), {"A": 2, "B": 2, "C": 2})
        for call in list(self.upstream.calls):
            call.answer(200, b"x")
        self.assertEqual(self.context.reservations.totalReserved(), 0)
        self.start()
        self.assertEqual(self.upstream.nodesCalled()[-1], "A", "nothing leaked")

    def test_movesWithEachAttempt(self) -> None:
        """The reservation follows the node each attempt targets."""
        self.prioritize()
        ex, request = self.start()
        self.assertEqual(self.context.reservations.byNode(), {"A": 1})
        self.upstream.last().refuse()
        self.assertEqual(self.context.reservations.byNode(), {"B": 1})
        self.upstream.last().refuse()
        self.assertEqual(self.context.reservations.byNode(), {"C": 1})
        self.upstream.last().refuse()
        self.assertEqual(self.context.reservations.byNode(), {}, "released before the backoff")
        self.clock.advance(0.25)
        self.assertEqual(self.context.reservations.byNode(), {"A": 1}, "re-taken next round")

    def test_releasedOnEveryEnding(self) -> None:
        """Normal end, client abort, mid-copy failure, internal error, shutdown: all release."""
        self.prioritize()
        endings = {
            "normal": lambda ex, req, resp: (resp.send(b"x"), resp.end()),
            "abort": lambda ex, req, resp: req.lose(),
            "midcopy": lambda ex, req, resp: (resp.send(b"x"), resp.fail()),
            "shutdown": lambda ex, req, resp: ex.shutdown(),
            "status": lambda ex, req, resp: (resp.send(b"e"), resp.end()),
        }
        for name, end in endings.items():
            ex, request = self.start()
            response = self.upstream.last().respond(400 if name == "status" else 200)
            self.assertEqual(self.context.reservations.totalReserved(), 1, name)
            end(ex, request, response)
            self.clock.advance(0)
            self.assertEqual(self.context.reservations.totalReserved(), 0, name)
            self.assertEqual(self.context.activity.inFlight, {}, name)

    def test_newGenerationSupersedes(self) -> None:
        """A newer snapshot supersedes live reservations; their later release is dropped."""
        self.prioritize()
        ex, request = self.start()
        self.context.reservations.applyPriority(2, ["A", "B", "C"], {"A": NodeLoad(1, 0.0)})
        self.assertEqual(self.context.reservations.totalReserved(), 0)
        ex2, request2 = self.start()
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B"])
        self.upstream.calls[0].answer(200, b"x")
        self.assertEqual(self.context.reservations.byNode(), {"B": 1}, "never below zero")

    def test_redeliveredSnapshotKeepsReservations(self) -> None:
        """A redelivered generation changes nothing: live reservations still count."""
        self.prioritize()
        self.start()
        self.prioritize()
        self.start()
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B"])


class ActivityTests(LoopCase):
    """``discovery:node-activity`` on every change of the in-flight count."""

    def test_activityFollowsAttempts(self) -> None:
        """Dispatch to A (1), A fails (0), dispatch to B (1), B ends (0)."""
        ex, request = self.start()
        self.upstream.last().refuse()
        self.upstream.last().answer(200, b"x")
        self.assertEqual(self.context.sink.activity(), [("A", 1), ("A", 0), ("B", 1), ("B", 0)])

    def test_concurrentCounts(self) -> None:
        """Two requests on one node count 2."""
        self.facade.pin = "A"
        self.start()
        self.start()
        self.assertEqual(self.context.sink.activity(), [("A", 1), ("A", 2)])


class EventTests(LoopCase):
    """Exact event sequences (§5.5): ids, seq over every event, states, scheduledOn."""

    settings = {"maxDispatchAttempts": 3}

    def test_exhaustedBudgetSequence(self) -> None:
        """Three refusals on one owner: the final refusal answers 502; failed on A."""
        setNodes(self.facade, [node("A")])
        ex, request = self.start()
        for _ in range(3):
            self.upstream.last().refuse()
            self.clock.advance(5)
        self.assertEqual(request.code, 502)
        self.assertEqual(
            self.shape(),
            [
                ("workload:submitted", "queued", None),
                ("workload:submitted", "queued", "A"),
                ("workload:submitted", "queued", None),
                ("workload:submitted", "queued", "A"),
                ("workload:submitted", "queued", None),
                ("workload:submitted", "queued", "A"),
                ("workload:errored", "failed", "A"),
            ],
        )
        seqs = [i["seq"] for _, i in self.events()]
        self.assertEqual(seqs, list(range(1, 8)))

    def test_seqIsProcessWide(self) -> None:
        """Two workloads share one seq counter and get distinct ids."""
        ex1, r1 = self.start()
        ex2, r2 = self.start()
        infos = [i for _, i in self.events()]
        self.assertEqual([i["seq"] for i in infos], [1, 2, 3, 4])
        self.assertEqual([i["id"] for i in infos], ["1", "1", "2", "2"])

    def test_timestampsInMilliseconds(self) -> None:
        """createdAt/startedAt/completedAt are integer milliseconds."""
        self.clock.advance(1.5)
        ex, request = self.start()
        self.clock.advance(0.25)
        response = self.upstream.last().respond(200)
        response.send(b"x")
        self.clock.advance(1)
        response.end()
        info = self.terminal()
        self.assertEqual(
            (info["createdAt"], info["startedAt"], info["completedAt"]), (1500, 1750, 2750)
        )
        self.assertEqual(info["stats"]["ttftMs"], 250)


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

        def auto(call: Any) -> None:
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
        from nvpair.proxy.routing import placement

        def boom(*a: Any) -> None:
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
