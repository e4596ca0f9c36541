"""The fair queue and the breakers in the placement loop, on a Clock (spec §11 "The queue",
"The breaker"): waiting holds nothing, room lets the least-served client out, bounds answer
503 with Retry-After, a client that leaves is never sent, a fast-failing node goes last."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from twisted.internet import defer
from zope.interface.verify import verifyObject

from nvpair.proxy.facade.standalone import startStandalone
from nvpair.proxy.features import useStandalone
from nvpair.proxy.flow import breaker as b
from nvpair.proxy.flow.interfaces import IQueueing
from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.residency import Residency
from nvpair.proxy.ops.queuegauges import QueueCollector, queueStatus
from tests.support.cases.queuecase import QueueCase, client
from tests.support.exchangecase import LoopCase
from tests.support.fakes.standalone import FakeService

SECRET = b"Bearer sk-queue-secret"


class WaitTests(QueueCase):
    """Waiting while every owner is full, and leaving the queue."""

    def test_providesIQueueing(self) -> None:
        """The flow control is what the request context's ``queueing`` promises."""
        self.assertTrue(verifyObject(IQueueing, self.queueing))

    def test_waitsHoldingNothingThenDispatched(self) -> None:
        """A third request waits with no attempt, reservation or in-flight count, its
        workload still queued; the moment one of ours ends it goes to that node."""
        self.start(client(b"k1"))
        self.start(client(b"k2"))
        first = self.commit(0)
        self.commit(1)
        ex, request = self.start(client(b"k3"))
        self.assertEqual(len(self.upstream.calls), 2)
        self.assertEqual(self.depth(), 1)
        self.assertEqual(ex.attempts, 0)
        self.assertIsNone(ex.reservation)
        self.assertEqual(self.context.activity.inFlight, {"A": 1, "B": 1})
        mine = [i for m, i in self.events() if i["id"] == "3"]
        self.assertEqual([(i["state"], i.get("scheduledOn")) for i in mine], [("queued", None)])
        first.end()
        self.assertEqual(len(self.upstream.calls), 3)
        self.assertEqual(self.upstream.calls[2].nodeId, "A")
        self.assertEqual(self.depth(), 0)

    def test_crowdedWhileAnyWaitsOrIsHeld(self) -> None:
        """``crowded``: a request waiting in the queue, or one held for a full node, makes
        the proxy crowded; neither, it is not."""
        self.assertFalse(self.queueing.crowded())
        self.start(client(b"k1"))
        self.start(client(b"k2"))
        first = self.commit(0)
        self.commit(1)
        self.assertFalse(self.queueing.crowded(), "full, but nobody waits")
        self.start(client(b"k3"))
        self.assertTrue(self.queueing.crowded())
        first.end()
        self.assertFalse(self.queueing.crowded(), "let out")
        held = self.queueing.holdFor("B", 5.0)
        assert held is not None
        self.assertTrue(self.queueing.crowded())
        held.addErrback(lambda f: f.trap(defer.CancelledError))
        held.cancel()
        self.assertFalse(self.queueing.crowded())

    def test_fullQueueRefusedAtOnce(self) -> None:
        """Past --queue-max the client with the most waiting is refused: 503 queue_full at
        once with Retry-After, nothing sent or held, however many come (memory flat at the
        bound)."""
        self.start(client(b"k1"))
        self.start(client(b"k1"))
        waiting = [self.start(client(b"k1"))[1] for _ in range(4)]
        refused = [self.start(client(b"k1"))[1] for _ in range(50)]
        self.assertEqual(self.depth(), 4)
        self.assertEqual(len(self.upstream.calls), 2)
        for request in refused:
            self.assertEqual(request.code, 503)
            self.assertEqual(self.reason(request), "queue_full")
            self.assertGreaterEqual(int(request.header(b"retry-after")[0]), 1)  # type: ignore[index]
        self.assertTrue(all(r.code is None for r in waiting))
        self.assertEqual(len(self.context.exchanges), 6)

    def test_timeout(self) -> None:
        """Past --queue-timeout: 503 queue_timeout with Retry-After; the workload failed and
        nothing of it is left."""
        self.start(client(b"k1"))
        self.start(client(b"k1"))
        ex, request = self.start(client(b"k2"))
        self.clock.advance(29.9)
        self.assertIsNone(request.code)
        self.clock.advance(0.1)
        self.assertEqual(request.code, 503)
        self.assertEqual(self.reason(request), "queue_timeout")
        self.assertIsNotNone(request.header(b"retry-after"))
        self.assertEqual(self.depth(), 0)
        self.assertNotIn(ex, self.context.exchanges)
        self.assertEqual(len(self.upstream.calls), 2)

    def test_disconnectLeavesAtOnce(self) -> None:
        """A client that leaves while queued leaves the queue at once and never reaches an
        engine, even when room comes; its workload is cancelled."""
        self.start(client(b"k1"))
        self.start(client(b"k1"))
        first = self.commit(0)
        ex, request = self.start(client(b"k2"))
        request.lose()
        self.assertEqual(self.depth(), 0)
        first.end()
        self.assertEqual(len(self.upstream.calls), 2)
        self.assertEqual(ex.workload.state, "cancelled")  # type: ignore[union-attr]
        self.assertNotIn(ex, self.context.exchanges)

    def test_probeLetsOut(self) -> None:
        """An engine probe saying a slot is free dispatches the next waiter."""
        for n in ("A", "B"):
            self.ledger.configure(n, None)
            self.ledger.probed(n, 0, 1, 60.0)
        self.start(client(b"k1"))
        self.start(client(b"k1"))
        self.start(client(b"k2"))
        self.assertEqual(self.depth(), 1)
        self.ledger.probeSent("B")
        self.ledger.probed("B", 1, 2, 60.0)  # B has a second slot now
        self.assertEqual(self.depth(), 0)
        self.assertEqual(self.upstream.calls[-1].nodeId, "B")


class DeadlineTests(QueueCase):
    """Queue time counts toward the job deadline."""

    settings: dict[str, Any] = {"queueMax": 4, "queueTimeout": 30.0, "jobDeadline": 10.0}

    def test_deadlineEndsTheWait(self) -> None:
        """A job deadline shorter than the queue timeout ends the wait first: 503
        deadline_exceeded with Retry-After, never sent."""
        self.start(client(b"k1"))
        self.start(client(b"k1"))
        self.clock.advance(4)
        ex, request = self.start(client(b"k2"))
        self.clock.advance(9.9)
        self.assertIsNone(request.code)
        self.clock.advance(0.1)
        self.assertEqual(self.reason(request), "deadline_exceeded")
        self.assertIsNotNone(request.header(b"retry-after"))
        self.assertEqual(len(self.upstream.calls), 2)


class ColdBurstTests(QueueCase):
    """A burst on a cold proxy: refused once it is sure they cannot start in time."""

    settings: dict[str, Any] = {"queueMax": 64, "queueTimeout": 3.0}

    def test_refusedBeforeAnyEnds(self) -> None:
        """Both slots taken, 30 waiting, none of ours ended yet: a second in, the first
        requests' age caps the drain rate (2 a second at most), so all but the 3 that could
        start within the 3 s timeout are refused ``queue_full`` at the next room check,
        before any request ended."""
        self.start(client(b"k1"))
        self.start(client(b"k2"))
        waiting = [self.start(client(b"k%d" % (i % 5)))[1] for i in range(30)]
        self.assertEqual(self.depth(), 30)
        self.clock.advance(1.0)
        self.ledger.probed("A", None, None, 1.0)
        refused = [r for r in waiting if r.code == 503]
        self.assertEqual(len(refused), 27)
        self.assertEqual({self.reason(r) for r in refused}, {"queue_full"})
        self.assertEqual(self.depth(), 3)


class FairnessTests(QueueCase):
    """Least-served client first."""

    settings: dict[str, Any] = {"queueMax": 64}

    def test_lightClientNotStarved(self) -> None:
        """A heavy client's backlog of six does not delay a light client's one request
        (a client seen before) beyond the next free slot."""
        self.start(client(b"light"))
        self.commit(0).end()
        self.start(client(b"heavy"))
        self.start(client(b"heavy"))
        for _ in range(6):
            self.start(client(b"heavy"))
        ex, _ = self.start(client(b"light"))
        self.commit(1).end()
        self.assertIs(self.upstream.calls[3].headers, ex.forwardHeaders)

    def test_userFieldNamesClient(self) -> None:
        """Without Authorization, the OpenAI ``user`` field separates clients."""
        body = json.dumps({"model": "m1", "messages": [], "user": "u1"}).encode()
        other = json.dumps({"model": "m1", "messages": [], "user": "u2"}).encode()
        self.start(body=other)
        self.commit(0).end()  # u2 has been served before
        for _ in range(5):
            self.start(body=body)
        ex, _ = self.start(body=other)
        self.commit(1).end()
        self.assertIs(self.upstream.calls[3].headers, ex.forwardHeaders)


class BusyAnswerTests(LoopCase):
    """No engine state: full is learned from busy answers."""

    nodes = ("A",)

    def setUp(self) -> None:
        super().setUp()
        self.queueing = useStandalone(self.context, affinity=False).queueing

    def test_busyThenQueuedThenSent(self) -> None:
        """A 503 while another of ours runs there marks the node full: the request waits in
        the queue (no backoff, no attempt) and goes once ours ends."""
        self.start()
        running = self.upstream.calls[0].respond(200)
        running.send(b"{}")
        ex, request = self.start()
        self.upstream.calls[1].respond(503)
        self.assertEqual(len(self.upstream.calls), 2)
        self.assertEqual(ex.attempts, 1)
        running.end()
        self.assertEqual(len(self.upstream.calls), 3)
        self.assertEqual(ex.attempts, 2)
        self.assertEqual(self.queueing.breakers.opened, 0)  # busy is no failure

    def test_nothingKnownGoesStraight(self) -> None:
        """With no state and no busy answer, requests go to the engine as before."""
        for _ in range(5):
            self.start()
        self.assertEqual(len(self.upstream.calls), 5)


class BreakerTests(LoopCase):
    """A fast-failing node goes last, is probed after its cool-down and heals."""

    nodes = ("A", "B")

    def setUp(self) -> None:
        super().setUp()
        self.queueing = useStandalone(self.context, affinity=False).queueing

    def serve(self) -> str:
        """One request: A fails fast while ``failing``; returns the node that served it."""
        self.start()
        while True:
            call = self.upstream.pending()[0]
            if call.nodeId == "A" and self.failing:
                call.respond(503)
                continue
            response = call.respond(200)
            response.send(b"{}")
            response.end()
            served: str = call.nodeId
            return served

    def test_demotedThenHealed(self) -> None:
        """After the threshold A is no longer tried first; a probe after the cool-down
        finds it healed and it takes traffic again."""
        self.failing = True
        for _ in range(b.THRESHOLD):
            self.serve()
        self.assertEqual(self.queueing.breakers.opened, 1)
        before = len(self.upstream.calls)
        for _ in range(10):
            self.serve()
        self.assertEqual(self.upstream.nodesCalled()[before:], ["B"] * 10)
        self.failing = False
        self.clock.advance(b.BASE_COOLDOWN)
        self.serve()
        self.assertEqual(self.upstream.calls[-1].nodeId, "A")
        self.assertEqual(self.queueing.breakers.state("A", self.clock.seconds()).value, "closed")


class PoisonTests(LoopCase):
    """A request's own fault never counts against the nodes' breakers (issue 32)."""

    nodes = ("A", "B", "C")

    def setUp(self) -> None:
        super().setUp()
        self.queueing = useStandalone(self.context, affinity=False).queueing

    def failures(self) -> dict[str, object]:
        now = self.clock.seconds()
        snapshot = self.queueing.breakers.snapshot(now)
        return {node: entry["recentFailures"] for node, entry in snapshot.items()}

    def test_poisonTripsNoBreaker(self) -> None:
        """Requests that make every engine answer 500, sent again and again: each is
        answered by its second node, and no breaker opens or counts a failure."""
        for _ in range(2 * b.THRESHOLD):
            ex, request = self.start()
            for _ in range(2):
                self.upstream.pending()[0].answer(500, b"poison")
            self.assertEqual(request.code, 500)
        self.assertEqual(self.queueing.breakers.opened, 0)
        self.assertEqual(self.failures(), {})

    def test_nodeFaultStillCounts(self) -> None:
        """A 500 from A then a success on B: A's fault, one failure toward its breaker; a
        500 from A whose client then leaves: A's too."""
        ex, request = self.start()
        self.upstream.pending()[0].answer(500)
        self.upstream.pending()[0].answer(200, b"{}")
        self.assertEqual(self.failures(), {"A": 1})
        ex, request = self.start()
        self.upstream.pending()[0].answer(500)
        request.lose()
        self.assertEqual(self.failures(), {"A": 2})


class ModeTests(LoopCase):
    """Standalone wires the queue and breakers; under a broker nothing changes."""

    nodes = ("A",)

    def test_brokerBacksOffAsBefore(self) -> None:
        """With no queueing (a broker), a busy 503 is retried after the backoff, never
        queued, and no node is ever demoted."""
        self.assertIsNone(self.context.queueing)
        self.start()
        running = self.upstream.calls[0].respond(200)
        running.send(b"{}")
        ex, _ = self.start()
        self.upstream.calls[1].respond(503)
        self.assertEqual(len(self.upstream.calls), 2)
        self.clock.advance(self.context.settings.backoffBase)
        self.assertEqual(len(self.upstream.calls), 3)
        self.assertEqual(ex.attempts, 2)
        self.assertEqual(ex.seat.demote([]), ([], (), ()))

    def test_standaloneWiresQueueing(self) -> None:
        """``startStandalone`` gives the context a queue over a room ledger and a residency
        view, both listening to in-flight changes (the residency view per model); a process
        under a broker has none."""
        service = FakeService(("llamacpp",), ())
        startStandalone(service)
        ledger, residency = service.context.ledger, service.context.residency
        self.assertIsNotNone(service.context.queueing)
        self.assertIsNotNone(service.context.loads)
        assert isinstance(ledger, RoomLedger)
        assert isinstance(residency, Residency)
        activity = service.context.activity
        activity.change("http://a", +1, "m")
        self.assertEqual(residency.running("http://a", "m"), 1)
        self.assertIsNotNone(ledger.rooms.get("http://a"))
        activity.change("http://a", -1, "m")
        self.assertEqual(residency.running("http://a", "m"), 0)


class VisibleTests(QueueCase):
    """What /metrics and /status show of the queue and the breakers."""

    def test_metricsAndStatus(self) -> None:
        """Depth per facade and model, refusals by reason, the wait histogram, breaker
        state and opens; /status's ``queueing`` object holds the same."""
        self.start(client(b"k1"))
        self.start(client(b"k1"))
        for _ in range(5):
            self.start(client(b"k2"))  # 4 wait, 1 refused
        for _ in range(b.THRESHOLD):
            self.queueing.breakers.failed("B", self.clock.seconds())
        registry = CollectorRegistry()
        registry.register(QueueCollector(lambda: self.queueing))
        text = generate_latest(registry).decode()
        self.assertIn('nvpair_proxy_queue_depth{engine="llamacpp",model="m1"} 4.0', text)
        self.assertIn(
            'nvpair_proxy_queue_refusals_total{engine="llamacpp",reason="queue_full"} 1.0', text
        )
        self.assertIn("nvpair_proxy_queue_wait_seconds_bucket", text)
        self.assertIn('nvpair_proxy_breaker_state{node="B"} 2.0', text)
        self.assertIn('nvpair_proxy_breaker_opens_total{node="B"} 1.0', text)
        status = queueStatus(self.queueing)
        assert status is not None
        self.assertEqual(
            status["queues"],
            {
                "llamacpp": {
                    "m1": {
                        "depth": 4,
                        "oldestWaitSeconds": 0.0,
                        "lastWaitSeconds": 0.0,
                        "dispatched": 0,
                    }
                }
            },
        )
        self.assertEqual(status["refused"], {"llamacpp": {"queue_full": 1}})
        self.assertEqual(status["breakers"]["B"]["state"], "open")  # type: ignore[index]
        self.assertIsNone(queueStatus(None))
        self.assertNotIn("k1", repr(status))
