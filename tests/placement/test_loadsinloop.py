"""Placement that counts loads in the placement loop, on a Clock (spec §11, "Placement that
counts loads"): a model loaded nowhere is loaded on one node while the others wait in the
proxy; a warm node that is full is waited for rather than a cold one loaded; a load whose
request failed is no longer expected."""

from __future__ import annotations

from typing import Any

from nvpair.proxy.features import useStandalone
from nvpair.proxy.nodestate.interfaces import ModelState
from nvpair.proxy.nodestate.probes import EngineReport, ResidentModel
from nvpair.proxy.testing.upstreamspy import FakeResponse
from tests.support.exchangecase import LoopCase
from tests.support.fakerequest import FakeRequest
from tests.support.fakeupstream import makeFacade, node

FUTURE = "2030-01-01T00:00:00Z"


def ps(*models: str) -> EngineReport:
    """An Ollama ``/api/ps`` report holding ``models``."""
    resident = tuple(ResidentModel(m, until=FUTURE) for m in models)
    return EngineReport(loaded=frozenset(models), resident=resident)


class LoadsCase(LoopCase):
    """Owners A, B and C of ``m1``, Ollama-like (no slots reported), standalone's features."""

    nodes: tuple[str, ...] = ("A", "B", "C")
    settings: dict[str, Any] = {"queueMax": 64, "queueTimeout": 30.0}

    def setUp(self) -> None:
        super().setUp()
        self.features = useStandalone(self.context, affinity=False)
        self.residency = self.features.residency

    def hold(self, **held: tuple[str, ...]) -> None:
        """Each named node's fresh probe lists ``models``."""
        for nodeId, models in held.items():
            self.features.states.record(nodeId, ps(*models), 1.0, "/api/ps")
            self.residency.observe(nodeId, ps(*models))

    def commit(self, index: int) -> FakeResponse:
        """Upstream call ``index`` answers 200 and its first byte arrives."""
        response: FakeResponse = self.upstream.calls[index].respond(200)
        response.send(b"{}")
        return response

    def depth(self) -> int:
        return sum(d for _, _, d, _, _ in self.features.queueing.depths())


class ColdTests(LoadsCase):
    """Loaded nowhere."""

    def test_twentyTogetherOneLoad(self) -> None:
        """Twenty requests arriving together: one goes to one node (the model loading there
        from then on), nineteen wait in the proxy; its first byte ends the load and all
        nineteen go to that same node."""
        self.hold(A=(), B=(), C=())
        for _ in range(20):
            self.start()
        self.assertEqual(len(self.upstream.calls), 1)
        loader = self.upstream.calls[0].nodeId
        self.assertIs(self.residency.state(loader, "m1"), ModelState.LOADING)
        self.assertEqual(self.depth(), 19)
        # The fleet's demand counts every request as it arrives, the nineteen waiting too;
        # the loading node's own demand, the one request started there.
        self.assertAlmostEqual(self.residency.demand("m1"), 20.0)
        self.assertAlmostEqual(self.residency.demand("m1", loader), 1.0)
        self.clock.advance(0.5)
        self.commit(0)
        self.assertIs(self.residency.state(loader, "m1"), ModelState.LOADED)
        self.assertEqual(len(self.upstream.calls), 20)
        self.assertEqual({call.nodeId for call in self.upstream.calls}, {loader})
        self.assertEqual(self.depth(), 0)
        self.assertEqual(self.residency.costs.known(loader, "m1"), 0.5)

    def test_demandCountedOncePerRequest(self) -> None:
        """A request placed again (its attempt failed) counts once in the fleet's demand."""
        self.hold(A=(), B=(), C=())
        self.start()
        self.upstream.calls[0].refuse()
        self.clock.advance(self.context.settings.backoffBase)
        self.assertEqual(len(self.upstream.calls), 2)
        self.assertAlmostEqual(self.residency.demand("m1"), 1.0, places=2)

    def test_failedLoadIsNotExpected(self) -> None:
        """The request that was to load fails there: no load is expected on that node any
        more, and the request is placed again."""
        self.hold(A=(), B=(), C=())
        self.start()
        loader = self.upstream.calls[0].nodeId
        self.upstream.calls[0].refuse()
        self.assertIsNot(self.residency.state(loader, "m1"), ModelState.LOADING)
        self.clock.advance(self.context.settings.backoffBase)
        self.assertEqual(len(self.upstream.calls), 2)


class WarmTests(LoadsCase):
    """Warm on a node that is full, cold on idle ones."""

    def test_waitForTheWarmNode(self) -> None:
        """A is warm and full (one slot), B and C cold and idle: the next request waits in
        the proxy for A (nothing loads), and goes there when A's request ends."""
        self.hold(A=("m1",), B=("x",), C=())
        self.features.ledger.configure("A", 1)
        self.start()
        first = self.commit(0)
        self.start()
        self.assertEqual(len(self.upstream.calls), 1)
        self.assertEqual(self.depth(), 1)
        first.end()
        self.assertEqual([call.nodeId for call in self.upstream.calls], ["A", "A"])
        self.assertEqual(self.residency.holders("m1"), ("A",))


class FeedTests(LoadsCase):
    """What our requests teach the residency view."""

    def test_warmFirstByteTeachesParallel(self) -> None:
        """A warm request's first byte since dispatch, with the number of ours then running
        on the node, is a sample for what the engine serves at once; what that learns bounds
        the node's room in the ledger."""
        self.hold(A=("m1",), B=(), C=())
        self.start()
        self.clock.advance(0.25)
        self.commit(0).end()
        levels = self.residency.concurrency.snapshot("A")["levels"]
        self.assertEqual(levels, {"1": {"waitSeconds": 0.25, "samples": 1}})
        for running, wait in ((1, 0.25), (1, 0.25), (2, 3.0), (2, 3.0), (2, 3.0)):
            self.residency.concurrency.observe("A", running, wait)
        self.assertEqual(self.features.ledger.free("A"), 1)

    def test_reportedLoadTime(self) -> None:
        """An Ollama answer that waited for a load (``load_duration``) tells what the load
        cost there, and that wait is not counted in the node's service time."""
        self.facade = makeFacade(self.clock, [node(n) for n in self.nodes], engine="ollama")
        self.hold(A=(), B=(), C=())
        self.start(FakeRequest(path=b"/api/chat"), model="m1:latest")
        loader = self.upstream.calls[0].nodeId
        self.clock.advance(3.0)
        response = self.commit(0)
        response.send(b'\n{"done":true,"eval_count":1,"load_duration":2500000000}\n')
        response.end()
        self.assertEqual(self.residency.costs.known(loader, "m1:latest"), 2.5)
        self.assertEqual(self.features.ledger.serviceTime(loader), 0.5)


class PaidTests(LoadsCase):
    """What the queue waited while a further copy loaded is that copy's to pay."""

    nodes = ("A", "B")

    def waited(self) -> float:
        return self.features.queueing.backlog(self.facade, "m1").waited

    def test_waitDuringALoadIsPaid(self) -> None:
        """A copy loads on B while A (warm, one slot) is full: a request that waited for A
        meanwhile adds nothing to what counts towards yet another copy; once B is loaded,
        a request's wait counts again."""
        self.hold(A=("m1",), B=())
        self.features.ledger.configure("A", 1)
        self.features.ledger.configure("B", 1)
        self.residency.loadStarted("B", "m1")
        self.start()
        first = self.commit(0)
        self.start()
        self.assertEqual(self.depth(), 1)
        self.clock.advance(11.0)
        first.end()
        self.assertEqual([call.nodeId for call in self.upstream.calls], ["A", "A"])
        self.assertEqual(self.waited(), 0.0)
        self.residency.loadDone("B", "m1")
        self.assertIs(self.residency.state("B", "m1"), ModelState.LOADED)
        self.start()
        self.assertEqual(self.upstream.calls[2].nodeId, "B")
        self.commit(2)
        self.start()
        self.assertEqual(self.depth(), 1)
        self.clock.advance(3.0)
        self.commit(1).end()
        self.assertEqual(self.upstream.calls[3].nodeId, "A")
        self.assertEqual(self.waited(), 3.0)

    def test_loadBesideACopyCounts(self) -> None:
        """Another model loading on A, where m1's only copy is (one slot), holds none of
        m1's slots: a request for m1 that waited meanwhile counts what it waited."""
        self.hold(A=("m1",), B=())
        self.features.ledger.configure("A", 1)
        self.residency.loadStarted("A", "m2")
        self.start()
        first = self.commit(0)
        self.start()
        self.assertEqual(self.depth(), 1)
        self.clock.advance(5.0)
        first.end()
        self.assertEqual([call.nodeId for call in self.upstream.calls], ["A", "A"])
        self.assertIs(self.residency.state("A", "m2"), ModelState.LOADING)
        self.assertEqual(self.waited(), 5.0)

    def test_queueBuiltDuringALoadIsPaid(self) -> None:
        """Requests that came while m1's first copy loaded (one slot) and waited on after
        the load was done, the queue draining: their whole wait is the load's to pay; one
        that came after the load counts."""
        self.hold(A=(), B=())
        self.features.ledger.configure("A", 1)
        self.features.ledger.configure("B", 1)
        self.start()
        loader = self.upstream.calls[0].nodeId
        self.start()
        self.assertEqual(self.depth(), 1)
        self.clock.advance(3.0)
        first = self.commit(0)
        self.assertIs(self.residency.state(loader, "m1"), ModelState.LOADED)
        self.clock.advance(2.0)
        first.end()
        self.assertEqual([call.nodeId for call in self.upstream.calls], [loader] * 2)
        self.assertEqual(self.waited(), 0.0)
        second = self.commit(1)
        self.start()
        self.assertEqual(self.depth(), 1)
        self.clock.advance(2.0)
        second.end()
        self.assertEqual(self.waited(), 2.0)


class EngineWaitTests(LoadsCase):
    """Before an engine's slots are known the proxy does not hold its requests: they queue
    inside it.  What a request waited there for a slot (its first byte's wait beyond the
    baseline) counts in its model's queue towards a further copy, as a wait in the proxy's
    queue does."""

    nodes = ("A", "B")

    def setUp(self) -> None:
        super().setUp()
        self.hold(A=("m1",), B=())
        for _ in range(3):  # a baseline: 20 ms before the first byte with one running
            self.residency.concurrency.observe("A", 1, 0.02)

    def waited(self) -> float:
        return self.features.queueing.backlog(self.facade, "m1").waited

    def serve(self, firstByte: float) -> None:
        """One request for m1, served by A, its first byte after ``firstByte`` seconds."""
        self.start()
        self.assertEqual(self.upstream.calls[-1].nodeId, "A")
        self.clock.advance(firstByte)
        self.commit(len(self.upstream.calls) - 1).end()

    def test_queuedInsideTheEngine(self) -> None:
        """A first byte after 2 s where 20 ms is the baseline: 1.98 s waited; one at the
        baseline, or under a rise (twice it and 40 ms, answers being that short), adds
        nothing."""
        self.serve(0.02)
        self.assertEqual(self.waited(), 0.0)
        self.serve(2.0)
        self.assertAlmostEqual(self.waited(), 1.98)
        self.serve(0.07)
        self.assertAlmostEqual(self.waited(), 1.98, places=2)  # decayed over 0.07 s only

    def test_noBaselineNothingCounted(self) -> None:
        """On a node with no baseline yet, no wait is told from the work."""
        self.residency.concurrency.forget("A")
        self.serve(2.0)
        self.assertEqual(self.waited(), 0.0)

    def test_drainAfterALoadIsPaid(self) -> None:
        """Three requests wait in the proxy for m1's load on A and go to A together once it
        is done; what they then wait inside A (its slots not known) is the load's to pay.
        A request sent later that waits there counts (beyond the baseline, which the three
        raised: level 1 now averages 0.02 + (2 - 0.02) / 4)."""
        self.residency.loadStarted("A", "m1")
        for _ in range(3):
            self.start()
        self.assertEqual(self.depth(), 3)
        self.clock.advance(3.0)
        self.residency.loadDone("A", "m1")
        self.features.queueing.drain()
        self.assertEqual([call.nodeId for call in self.upstream.calls], ["A"] * 3)
        self.clock.advance(2.0)
        for index in range(3):
            self.commit(index).end()
        self.assertEqual(self.waited(), 0.0)
        self.serve(2.0)
        self.assertAlmostEqual(self.waited(), 2.0 - (0.02 + 1.98 / 4), places=3)

    def test_loadBesideCounts(self) -> None:
        """While another model loads beside the copy, what m1 waited inside A counts: that
        load holds none of m1's slots."""
        self.residency.loadStarted("A", "m2")
        self.serve(2.0)
        self.assertAlmostEqual(self.waited(), 1.98)


class PerModelSlotsTests(LoadsCase):
    """Ollama's parallel slots are per model (``OLLAMA_NUM_PARALLEL``): a node holding two
    models runs that many of each at once."""

    nodes = ("A",)

    def setUp(self) -> None:
        super().setUp()
        self.facade = makeFacade(self.clock, [node("A", models=("m1", "m2"))])
        self.hold(A=("m1", "m2"))
        for running, wait in ((1, 0.25),) * 3 + ((2, 0.25),) * 3 + ((3, 3.0),) * 3:
            self.residency.concurrency.observe("A", running, wait)

    def test_fullPerModel(self) -> None:
        """Two per model learnt: a third request for m1 waits in the proxy while two run,
        and a request for m2 still goes to the node (the ledger's limit is two per model
        held: four)."""
        self.assertEqual(self.residency.concurrency.learnt("A"), 2)
        self.assertEqual(self.features.ledger.free("A"), 4)
        self.start(model="m1")
        self.start(model="m1")
        self.start(model="m1")
        self.assertEqual(len(self.upstream.calls), 2)
        self.assertEqual(self.depth(), 1)
        self.assertTrue(self.residency.modelFull("A", "m1"))
        self.assertFalse(self.residency.modelFull("A", "m2"))
        self.start(model="m2")
        self.assertEqual(len(self.upstream.calls), 3)
        self.assertEqual(self.depth(), 1)

    def test_reportedSlotsAreRead(self) -> None:
        """An engine that reports its slots is read, not second-guessed by what was learnt:
        two of m1 running fill m1 there until a fresh report says slots are free."""
        self.start(model="m1")
        self.start(model="m1")
        self.assertTrue(self.residency.modelFull("A", "m1"))
        ledger = self.features.ledger
        ledger.probeSent("A")
        ledger.probed("A", busy=2, total=4, interval=1.0)
        self.assertTrue(ledger.reportsSlots("A"))
        self.assertFalse(self.residency.modelFull("A", "m1"))
        self.assertIsNone(self.residency.parallel("A", "m1"), "the report is the figure")
        self.start(model="m1")
        self.assertEqual(len(self.upstream.calls), 3)

    def test_levelsPerModel(self) -> None:
        """A request's sample is taken at the level of ours for its model on the node when
        it was dispatched: an m2 request beside two of m1 is a level-1 sample."""
        self.residency.concurrency.forget("A")
        self.start(model="m1")
        self.start(model="m1")
        self.start(model="m2")
        self.clock.advance(0.25)
        for index in (2, 1, 0):
            self.commit(index).end()
        levels = self.residency.concurrency.snapshot("A")["levels"]
        samples = {level: value["samples"] for level, value in levels.items()}  # type: ignore[attr-defined]
        self.assertEqual(samples, {"1": 2, "2": 1})
