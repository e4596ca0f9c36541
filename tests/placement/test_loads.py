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
from nvpair.proxy.nodestate.probes import EngineReport, ResidentModel
from nvpair.proxy.nodestate.residency import Residency
from nvpair.proxy.nodestate.states import EngineStates
from nvpair.proxy.placement.interfaces import Backlog, ILoadPlanner, LoadPlan
from nvpair.proxy.placement.loads import ROOM_WAIT, LoadPlanner, Tier
from nvpair.proxy.routing.nodes import Node

NOW = 1_800_000_000.0
FUTURE = "2030-01-01T00:00:00Z"
NODES = tuple(Node(n, False, (n,), frozenset({"m", "x", "y"})) for n in ("A", "B", "C"))
A, B, C = NODES


def ps(*models: str) -> EngineReport:
    """An Ollama ``/api/ps`` report holding ``models``."""
    resident = tuple(ResidentModel(m, until=FUTURE) for m in models)
    return EngineReport(loaded=frozenset(models), resident=resident)


class PlanCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(NOW)
        self.ours: dict[str, int] = {}
        self.ledger = RoomLedger(self.clock, self.ours)
        self.states = EngineStates(self.clock, self.ledger)
        self.residency = Residency(self.clock, self.states, self.ledger)
        self.planner = LoadPlanner(self.residency, self.ledger)

    def hold(self, **held: tuple[str, ...]) -> None:
        """Every node's fresh probe: ``A=("m",)`` holds m; a node not named says nothing."""
        for node, models in held.items():
            self.states.record(node, ps(*models), 1.0, "/api/ps")
            self.residency.observe(node, ps(*models))

    def learnCapacity(self, node: str, models: tuple[str, ...]) -> None:
        """``node`` is seen holding ``models`` at once (what it can hold), then nothing."""
        self.hold(**{node: models})
        self.hold(**{node: ()})

    def serve(self, node: str, slots: int, seconds: float) -> None:
        """``node`` runs ``slots`` of ours at most (``max_concurrency``), each ``seconds``."""
        self.ledger.configure(node, slots)
        self.ledger.finished(node, seconds)

    def begin(self, node: str, model: str) -> None:
        """A request for ``model`` arrives and starts on ``node``."""
        self.residency.requested(model)
        self.residency.began(node, model)

    def start(self, node: str, model: str, count: int) -> None:
        """``count`` of ours for ``model`` start on ``node``."""
        for _ in range(count):
            self.ours[node] = self.ours.get(node, 0) + 1
            self.begin(node, model)

    def plan(
        self, ahead: int = 0, owners: tuple[Node, ...] = NODES, waited: float = 0.0
    ) -> LoadPlan:
        return self.planner.plan(owners, "m", Backlog(ahead, waited))


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

    def use(self, node: str, model: str, count: int) -> None:
        """``count`` of ours for ``model`` on ``node``, each ended."""
        for _ in range(count):
            self.begin(node, model)
            self.residency.ended(node, model)

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


class SpillTests(PlanCase):
    """Warm copies all full: a further copy only when their wait exceeds a load elsewhere."""

    def setUp(self) -> None:
        super().setUp()
        self.learnCapacity("B", ("x", "y"))
        self.hold(A=("m",), B=("x",), C=())
        self.serve("A", 2, 1.0)  # two slots, a second each: two requests a second
        self.start("A", "m", 2)

    def test_waitShorterThanALoad(self) -> None:
        """Predicted wait ((ahead + 1) / 2 per second) under the 10 s default load: the warm
        owners only (the request waits for them in the proxy)."""
        self.assertEqual(self.plan(ahead=18), LoadPlan((A,)))

    def test_waitLongerThanALoad(self) -> None:
        """Past it: the cheapest cold owner alone (B has room), where the request loads."""
        self.assertEqual(self.plan(ahead=20), LoadPlan((B,), B))

    def test_oneCopyAtATime(self) -> None:
        """While that copy loads it counts at the warm copies' rate: another load only once
        the wait beyond both exceeds a load."""
        self.residency.loadStarted("B", "m")
        self.assertEqual(self.plan(ahead=38), LoadPlan((A, B)))
        self.assertEqual(self.plan(ahead=40), LoadPlan((C,), C))

    def test_waitedLongerThanALoad(self) -> None:
        """What the model's requests waited lately past a load's seconds times the copies
        (``ROOM_WAIT`` of it where the copy goes into free room: it evicts nothing): a
        further copy, however short the queue now; not while a copy loads."""
        self.assertEqual(self.plan(waited=ROOM_WAIT * 10 - 0.1), LoadPlan((A,)))
        self.assertEqual(self.plan(waited=ROOM_WAIT * 10 + 0.1), LoadPlan((B,), B))
        self.residency.loadStarted("B", "m")
        self.assertEqual(self.plan(waited=1000.0), LoadPlan((A, B)))

    def test_roomForTheNeediest(self) -> None:
        """Free room goes to the model bin-packing would give it: not to this one while a
        resident model's demand per copy with one more exceeds this one's by
        ``SHARE_MARGIN`` (x: 10 a minute, 5 with one more copy; m: 2, 1 with one more)."""
        for _ in range(10):
            self.begin("B", "x")
            self.residency.ended("B", "x")
        self.assertEqual(self.residency.neediest(), 5.0)
        self.assertEqual(self.plan(ahead=1000, waited=1000.0), LoadPlan((A,)))
        self.start("A", "m", 6)  # m: 8 a minute, 4 per copy with one more
        self.assertEqual(self.plan(waited=1000.0), LoadPlan((B,), B))

    def test_evictingWaitsAWholeLoad(self) -> None:
        """Where the copy would evict (an idle copy of x, resident on A too), what was
        waited must pass a whole load's seconds."""
        self.learnCapacity("C", ("x",))
        self.hold(A=("m", "x"), C=("x",))
        self.assertEqual(self.plan(waited=9.5, owners=(A, C)), LoadPlan((A,)))
        self.assertEqual(self.plan(waited=10.5, owners=(A, C)), LoadPlan((C,), C))

    def test_unknownRateStaysWarm(self) -> None:
        """A warm copy whose service time is not known yet: no spill for the queue's length,
        however long (stay warm when uncertain); what was waited still counts."""
        self.ledger.forget("A")
        self.ledger.configure("A", 2)
        self.assertEqual(self.plan(ahead=1000), LoadPlan((A,)))
        self.assertEqual(self.plan(ahead=1000, waited=11.0), LoadPlan((B,), B))

    def test_notKnownFull(self) -> None:
        """A node never seen evicting takes a further copy only while it holds fewer models
        than another owner was seen holding (B, full, was seen holding two); holding as
        many, a load there is taken to evict (an idle copy of x or y, resident on the other
        too, not used lately: a whole load waited)."""
        self.hold(B=("x", "y"), C=("x",))
        self.assertEqual(self.planner.cheapest((B, C), "m").tier, Tier.UNKNOWN)
        self.assertEqual(self.plan(waited=11.0), LoadPlan((C,), C))
        self.hold(C=("x", "y"))
        self.assertEqual(self.planner.cheapest((B, C), "m").tier, Tier.COPY)
        self.assertEqual(self.plan(waited=9.0), LoadPlan((A,)))
        self.assertIn(self.plan(waited=11.0).load, (B, C))

    def test_neverEvictAnOnlyCopy(self) -> None:
        """With no room on any other node, a further copy never pushes out the only copy of
        a model, used lately or not, idle or busy."""
        self.hold(A=("m", "z"), B=("x", "z"))
        self.learnCapacity("C", ("y",))
        self.hold(C=("y",))
        self.assertEqual(self.plan(ahead=1000, owners=(A, C)), LoadPlan((A,)))
        self.begin("C", "y")
        self.residency.ended("C", "y")
        self.assertEqual(self.plan(ahead=1000, owners=(A, C)), LoadPlan((A,)))
        self.start("C", "y", 1)
        self.assertEqual(self.plan(ahead=1000, owners=(A, C)), LoadPlan((A,)))

    def test_copyGivesWayByDemandPerCopy(self) -> None:
        """A copy of a model resident elsewhere makes room when it was not used on that
        node lately, or when its model's demand per copy is under 1 / ``SHARE_MARGIN`` of
        this model's per copy with one more (bin-packing by popularity's order); else it
        stays."""
        self.learnCapacity("C", ("x",))
        self.hold(A=("m", "x"), C=("x",))
        self.assertEqual(self.planner.cheapest((C,), "m").tier, Tier.COPY)
        self.assertEqual(self.plan(ahead=50, owners=(A, C)), LoadPlan((C,), C))
        self.begin("C", "x")  # x: 1 a minute over 2 copies; m: 2 over 2
        self.residency.ended("C", "x")
        self.assertEqual(self.plan(ahead=50, owners=(A, C)), LoadPlan((C,), C))
        for _ in range(3):  # x: 4 a minute over 2 copies
            self.begin("C", "x")
            self.residency.ended("C", "x")
        self.assertEqual(self.plan(ahead=50, owners=(A, C)), LoadPlan((A,)))

    def test_onlyCopyMovesToRoom(self) -> None:
        """With room on another node (B holds one of two), the only copy of a model whose
        demand is under 1 / ``SHARE_MARGIN`` of this one's per copy with one more gives way
        (its next request loads it there): the popular model's second copy is not left
        without a place because the room was beside its first; a popular one stays."""
        self.learnCapacity("C", ("y",))
        self.hold(C=("y",))
        for _ in range(4):  # m: 6 a minute, 3 per copy with one more
            self.begin("A", "m")
            self.residency.ended("A", "m")
        self.start("C", "y", 1)  # y: 1 a minute, one copy
        self.assertTrue(self.residency.roomElsewhere("C"))
        self.assertEqual(self.plan(ahead=1000, owners=(A, C)), LoadPlan((C,), C))
        self.start("C", "y", 2)  # y: 3 a minute
        self.assertEqual(self.plan(ahead=1000, owners=(A, C)), LoadPlan((A,)))

    def test_busyCopyGivesWayByDemandPerCopy(self) -> None:
        """A busy copy of a model resident elsewhere gives way by the same rule (it drains
        first): the most popular model's second copy takes the place of a less popular
        one's, never the other way round."""
        self.learnCapacity("C", ("x",))
        self.hold(A=("m", "x"), C=("x",))
        self.start("C", "x", 1)  # x: 1 a minute over 2 copies; m: 2 over 2
        self.assertEqual(self.planner.cheapest((C,), "m").tier, Tier.DISPLACE)
        self.assertEqual(self.plan(ahead=50, owners=(A, C)), LoadPlan((C,), C))
        self.start("C", "x", 3)  # x: 4 a minute over 2 copies
        self.assertEqual(self.plan(ahead=50, owners=(A, C)), LoadPlan((A,)))


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
