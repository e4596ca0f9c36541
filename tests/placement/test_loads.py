"""Placement that counts loads (spec §11, "Placement that counts loads"): which owners a
request may use given what each holds, what a load costs and what it would evict; pure,
over a real residency view and room ledger on a ``Clock``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nvpair.proxy.nodestate.interfaces import ModelState
from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.placement.interfaces import ILoadPlanner, LoadPlan
from nvpair.proxy.placement.loads import Tier
from nvpair.proxy.routing.nodes import Node
from tests.support.cases.loadplan import NODES, A, B, C, PlanCase


class NoLoadTests(PlanCase):
    """When no load is in question the owners are left as they are."""

    def test_interface(self) -> None:
        """The planner provides the interface the queue and the policy type it by."""
        self.assertTrue(verifyObject(ILoadPlanner, self.planner))

    def test_nothingKnown(self) -> None:
        """Engines that say nothing of models (or no fresh probe yet): every owner."""
        self.assertEqual(self.plan(), LoadPlan(NODES))

    def test_warmEverywhere(self) -> None:
        """The model loaded on every owner: every owner."""
        self.hold(A=("m",), B=("m",), C=("m", "x"))
        self.assertEqual(self.plan(), LoadPlan(NODES))

    def test_warmWithRoomOnly(self) -> None:
        """Warm on A, cold on B and C: A alone while it has room (its ledger says so or
        knows nothing), however many wait."""
        self.hold(A=("m",), B=("x",), C=())
        self.assertEqual(self.plan(ahead=1000), LoadPlan((A,)))
        self.serve("A", 2, 1.0)
        self.start("A", "m", 1)
        self.assertEqual(self.plan(ahead=1000), LoadPlan((A,)))

    def test_unknownCountsAsWarm(self) -> None:
        """An owner whose engine says nothing of models may serve it (a single-model
        engine): it and the warm ones, never the cold ones."""
        self.hold(A=("m",), B=())
        self.assertEqual(self.plan(), LoadPlan((A, C)))


class ColdTests(PlanCase):
    """Loaded nowhere: exactly one owner, the cheapest to load on."""

    def test_oneNodeThenItsLoad(self) -> None:
        """The first request goes alone to one node and starts a load there; every later
        one (twenty arriving together) waits for that load, starting none."""
        self.hold(A=(), B=(), C=())
        first = self.plan()
        assert first.load is not None
        self.assertEqual(first.usable, (first.load,))
        self.residency.loadStarted(first.load.id, "m")
        for ahead in range(20):
            self.assertEqual(self.plan(ahead), LoadPlan((first.load,)))
        self.assertTrue(self.planner.loading(first.load.id, "m"))

    def test_roomBeforeEviction(self) -> None:
        """A node with room for one more model wins over one that must evict."""
        self.learnCapacity("A", ("x", "y"))
        self.learnCapacity("B", ("x", "y"))
        self.hold(A=("x", "y"), B=("x",), C=("x", "y"))
        self.learnCapacity("C", ("x", "y"))
        self.hold(C=("x", "y"))
        self.assertEqual(self.plan().load, B)

    def test_evictACopyBeforeAnOnlyCopy(self) -> None:
        """Both full: the node whose victim is resident elsewhere too goes first."""
        self.learnCapacity("A", ("x",))
        self.learnCapacity("B", ("x",))
        self.hold(A=("y",), B=("x",), C=("x",))
        self.assertEqual(self.plan(owners=(A, B)).load, B)
        self.assertEqual(self.planner.cheapest((A, B), "m").tier, Tier.COPY)

    def test_idleVictimBeforeBusy(self) -> None:
        """Every resident model of A is running ours: a load there waits; B's idle one goes."""
        self.learnCapacity("A", ("x",))
        self.learnCapacity("B", ("y",))
        self.hold(A=("x",), B=("y",))
        self.start("A", "x", 1)
        self.assertEqual(self.plan(owners=(A, B)).load, B)
        self.assertEqual(self.planner.cheapest((A,), "m").tier, Tier.BUSY)

    def test_leastDemandVictim(self) -> None:
        """Two only copies: the one with less demand lately is evicted."""
        self.learnCapacity("A", ("x",))
        self.learnCapacity("B", ("y",))
        self.hold(A=("x",), B=("y",))
        for _ in range(5):
            self.begin("A", "x")
            self.residency.ended("A", "x")
        self.begin("B", "y")
        self.residency.ended("B", "y")
        self.assertEqual(self.plan(owners=(A, B)).load, B)

    def test_firstCopyBesideThePopular(self) -> None:
        """Room on both, one model each: a model's first copy goes beside the one with the
        most demand per copy (the room left stays beside the less popular one, where a
        further copy of the popular one can go); a further copy goes the other way, and so
        does a first copy of a model in more demand than both."""
        self.learnCapacity("A", ("x", "y"))
        self.learnCapacity("B", ("x", "y"))
        self.hold(A=("x",), B=("y",))
        self.use("A", "x", 5)
        self.use("B", "y", 1)
        self.assertEqual(self.planner.cheapest((A, B), "m").tier, Tier.ROOM)
        self.assertEqual(self.plan(owners=(A, B)).load, A)
        self.assertEqual(self.planner.cheapest((A, B), "m", further=True).node, B)
        self.use("B", "y", 9)
        self.assertEqual(self.plan(owners=(A, B)).load, B)
        self.assertEqual(self.planner.cheapest((A, B), "m", further=True).node, A)
        for _ in range(12):  # m in more demand than x and y: beside the least popular
            self.residency.requested("m")
        self.assertEqual(self.plan(owners=(A, B)).load, A)

    def test_firstCopyBesideALoadingPopular(self) -> None:
        """A model still loading counts as held for that: while x's requests wait for its
        load on A (nothing listed there yet), a model's first copy goes beside x, not
        beside the less popular y."""
        self.learnCapacity("A", ("x", "y"))
        self.learnCapacity("B", ("x", "y"))
        self.hold(A=(), B=("y",))
        self.residency.loadStarted("A", "x")
        for _ in range(5):
            self.residency.requested("x")  # waiting for the load: no request started yet
        self.use("B", "y", 1)
        self.assertEqual(self.residency.residentDemand("A"), 5.0)
        self.assertEqual(self.plan(owners=(A, B)).load, A)

    def test_fewestModelsBeforeDemand(self) -> None:
        """Models are spread first: a node holding fewer goes first, whatever they hold."""
        self.learnCapacity("A", ("x", "y", "z"))
        self.learnCapacity("B", ("x", "y", "z"))
        self.hold(A=("x",), B=("y", "z"))
        self.use("B", "y", 5)
        self.assertEqual(self.plan(owners=(A, B)).load, A)

    @settings(max_examples=50, deadline=None)
    @given(st.permutations(NODES))
    def test_sameNodeWhateverTheOrder(self, owners: list[Node]) -> None:
        """Ties go by rendezvous hashing on the model: the owners' order does not matter."""
        self.hold(A=(), B=(), C=())
        self.assertEqual(self.plan(owners=tuple(owners)).load, self.plan().load)

    def test_abandonedLoad(self) -> None:
        """The request that was to load fails: the model is cold there again."""
        self.hold(A=(), B=(), C=())
        load = self.plan().load
        assert load is not None
        self.residency.loadStarted(load.id, "m")
        self.residency.loadAbandoned(load.id, "m")
        self.assertIs(self.residency.state(load.id, "m"), ModelState.COLD)


class LoadingTests(PlanCase):
    """Loading somewhere, warm nowhere: wait for that load."""

    def test_waitForTheLoad(self) -> None:
        """The loading owner alone, however many wait: its rate is not known yet."""
        self.hold(A=(), B=(), C=())
        self.residency.loadStarted("C", "m")
        self.assertEqual(self.plan(ahead=500), LoadPlan((C,)))
        self.assertTrue(self.planner.loading("C", "m"))
        self.assertFalse(self.planner.loading("A", "m"))


class LedgerParallelTests(SynchronousTestCase):
    """What an engine reporting no slots serves at once, learnt, bounds its room."""

    def test_parallelSource(self) -> None:
        """The learnt parallel slots less ours, while no fresh report says the slots: the
        least of the sources, as the others."""
        ours = {"n": 1}
        ledger = RoomLedger(Clock(), ours)
        self.assertIsNone(ledger.free("n"))
        ledger.parallel = {"n": 2}.get
        self.assertEqual(ledger.free("n"), 1)
        ours["n"] = 2
        self.assertTrue(ledger.knownFull("n"))
        ledger.configure("n", 1)
        self.assertEqual(ledger.free("n"), -1)
        self.assertEqual(ledger.status("n")["learntParallel"], 2)

    def test_reportedSlotsWin(self) -> None:
        """An engine that reports its slots is not second-guessed by waits learnt there."""
        ledger = RoomLedger(Clock(), {"n": 1})
        ledger.parallel = {"n": 1}.get
        ledger.probed("n", busy=1, total=4, interval=1.0)
        self.assertEqual(ledger.free("n"), 3)
