"""The residency view (spec §11, "Model residency"): states, loads and evictions seen, what a
node holds and a load would evict, load costs, demand; pure, on a ``Clock``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.nodestate.holdings import EVICTION_SETTLE, MAX_EVENTS
from nvpair.proxy.nodestate.interfaces import Eviction, IModelActions, IResidency, ModelState
from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.loadcost import DEFAULT_LOAD_SECONDS
from nvpair.proxy.nodestate.probes import EngineReport, ResidentModel
from nvpair.proxy.nodestate.residency import DONE_GRACE, LISTING_TRUSTED, Residency
from nvpair.proxy.nodestate.states import EngineStates

NOW = 1_800_000_000.0
FUTURE = "2030-01-01T00:00:00Z"
PAST = "2020-01-01T00:00:00Z"


def ps(*models: str | ResidentModel) -> EngineReport:
    """An Ollama ``/api/ps`` report of these models."""
    resident = tuple(m if isinstance(m, ResidentModel) else ResidentModel(m, until=FUTURE)
                     for m in models)  # fmt: skip
    return EngineReport(loaded=frozenset(r.name for r in resident), resident=resident)


def router(**states: str) -> EngineReport:
    """A llama.cpp router's ``/models`` report: model -> status."""
    resident = tuple(ResidentModel(m, state=s) for m, s in sorted(states.items()))
    loaded = frozenset(m for m, s in states.items() if s == "loaded")
    return EngineReport(loaded=loaded, resident=resident, router=True)


class ResidencyCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(NOW)
        self.ledger = RoomLedger(self.clock, {})
        self.states = EngineStates(self.clock, self.ledger)
        self.view = Residency(self.clock, self.states, self.ledger)
        self.views = [self.view]  # each told of every probe, as the poller tells its one

    def probe(self, report: EngineReport, node: str = "n", advance: float = 1.0) -> None:
        self.clock.advance(advance)
        self.states.record(node, report, 1.0, "/api/ps")
        for view in self.views:
            view.observe(node, report)


class StateTests(ResidencyCase):
    """What a node holds, as its engine last said."""

    def test_interface(self) -> None:
        """The view provides the read interface placement types it by."""
        self.assertTrue(verifyObject(IResidency, self.view))

    def test_statesFromProbes(self) -> None:
        """Listed: loaded; not listed: cold; no listing for ``LISTING_TRUSTED`` s and no fresh
        probe, or a probe that says nothing of models: unknown."""
        self.assertIs(self.view.state("n", "a"), ModelState.UNKNOWN)
        self.probe(ps("a", "b"))
        self.assertIs(self.view.state("n", "a"), ModelState.LOADED)
        self.assertIs(self.view.state("n", "c"), ModelState.COLD)
        self.clock.advance(2.5)
        self.assertIs(self.view.state("n", "a"), ModelState.LOADED, "a recent listing holds")
        self.clock.advance(LISTING_TRUSTED)
        self.assertIs(self.view.state("n", "a"), ModelState.UNKNOWN, "stale")
        self.probe(EngineReport(busy=0, total=2), node="llama")
        self.assertIs(self.view.state("llama", "m"), ModelState.UNKNOWN)
        self.probe(router(a="loaded", b="loading", c="sleeping"), node="r")
        states = [self.view.state("r", m) for m in "abcd"]
        self.assertEqual(
            states, [ModelState.LOADED, ModelState.LOADING, ModelState.SLEEPING, ModelState.COLD]
        )
        self.assertEqual(self.view.holders("a"), ("r",))
        self.assertEqual(self.view.holders("b"), ("r",))

    def test_loadsAndEvictionsSeen(self) -> None:
        """A model newly listed is a load; one gone is unloaded (we asked), expired (its
        ``expires_at`` passed) or evicted; the first probe counts nothing."""
        self.probe(ps("a", "b"))
        self.probe(ps("a", "c"))
        self.probe(ps("a", ResidentModel("c", until=PAST), "d"))
        self.probe(ps("a", "d"))
        self.view.unloadAsked("n", "d")
        self.probe(ps("a"))
        status = self.view.nodeStatus("n")
        counts = [status[k] for k in ("loads", "evictions", "expired", "unloaded")]
        self.assertEqual(counts, [2, 1, 1, 1])
        events = [(e["event"], e["model"]) for e in status["events"]]  # type: ignore[attr-defined]
        self.assertEqual(
            events,
            [("load", "c"), ("evicted", "b"), ("load", "d"), ("expired", "c"), ("unloaded", "d")],
        )

    def test_routerTransitionMeasuresTheLoad(self) -> None:
        """A router model seen ``loading`` then ``loaded`` 3 s later: it costs 3 s there,
        and (unknown elsewhere) about that on other nodes too."""
        self.probe(router(a="unloaded"))
        self.probe(router(a="loading"))
        self.assertIs(self.view.state("n", "a"), ModelState.LOADING)
        self.probe(router(a="loading"))
        self.probe(router(a="loading"))
        self.probe(router(a="loaded"))
        self.assertEqual(self.view.loadSeconds("n", "a"), 3.0)
        self.assertEqual(self.view.loadSeconds("other", "a"), 3.0)
        self.assertEqual(self.view.loadSeconds("other", "b"), DEFAULT_LOAD_SECONDS)

    def test_ourLoadIsLoadingAtOnce(self) -> None:
        """A load the proxy starts is ``loading`` before any probe says so; Ollama lists a
        loading model as resident, so it stays loading until its first byte (or its
        expected load time) comes; a router's ``loaded`` ends it at once."""
        self.probe(ps())
        self.view.loadStarted("n", "a")
        self.assertIs(self.view.state("n", "a"), ModelState.LOADING)
        self.assertEqual(self.view.holders("a"), ("n",))
        self.probe(ps("a"))
        self.assertIs(self.view.state("n", "a"), ModelState.LOADING)
        self.view.coldFirstByte("n", "a", 4.0)
        self.assertIs(self.view.state("n", "a"), ModelState.LOADED)
        self.assertEqual(self.view.loadSeconds("n", "a"), 4.0)
        self.view.loadStarted("n", "b")
        self.probe(ps("a", "b"), advance=4.5)
        self.assertIs(self.view.state("n", "b"), ModelState.LOADED, "its expected time passed")
        self.view.loadStarted("r", "x")
        self.probe(router(x="loaded"), node="r")
        self.assertIs(self.view.state("r", "x"), ModelState.LOADED)
        self.view.loadStarted("n", "z")
        self.view.loadDuration("n", "z", 2_000_000_000)
        self.assertEqual(self.view.loadSeconds("n", "z"), 2.0)

    def test_doneBeforeListed(self) -> None:
        """A load seen done before any probe lists the model is ``loaded`` (and takes a
        place) until a probe lists it, or ``DONE_GRACE`` s pass with none listing it."""
        self.probe(ps("b"))
        self.view.loadStarted("n", "a")
        self.view.coldFirstByte("n", "a", 1.0)
        self.probe(ps("b"), advance=1.0)
        self.assertIs(self.view.state("n", "a"), ModelState.LOADED, "a probe sent before")
        self.assertEqual(self.view.holders("a"), ("n",))
        self.probe(ps("b"), advance=DONE_GRACE)
        self.assertIs(self.view.state("n", "a"), ModelState.COLD)
        self.view.loadStarted("n", "c")
        self.view.loadDone("n", "c")
        self.probe(ps("b", "c"))
        self.probe(ps("b"), advance=0.5)
        self.assertIs(self.view.state("n", "c"), ModelState.COLD, "listed, then gone")


class EvictionTests(ResidencyCase):
    """What a node can hold and what a load there would push out."""

    def test_capacityAndLeastRecentlyUsedIdle(self) -> None:
        """What a node can hold is the most it was seen holding: a lower bound, so no load
        is predicted to evict until the node was seen evicting; then, seen holding two, a
        third would evict the least recently used idle one; a busy one only when all are
        busy (then ``idle`` is False); with room, nothing."""
        self.probe(ps("a"))
        self.assertIsNone(self.view.likelyEviction("n", "b"), "a lower bound: no eviction")
        self.assertEqual(self.view.room("n"), 0)
        self.probe(ps("a", "b"))
        self.probe(ps("a", "x"))
        self.probe(ps("a", "b"))
        self.assertEqual(self.view.nodeStatus("n")["evictions"], 2)
        self.assertEqual(self.view.room("n"), 0)
        self.view.began("n", "b")
        self.view.ended("n", "b")
        self.clock.advance(1)
        self.view.began("n", "a")
        self.view.ended("n", "a")
        eviction = self.view.likelyEviction("n", "c")
        self.assertEqual(eviction, Eviction("b", True, eviction.demand, eviction.fleetDemand, 1))  # type: ignore[union-attr]
        self.view.began("n", "b")
        self.clock.advance(1)
        self.view.began("n", "a")
        busy = self.view.likelyEviction("n", "c")
        self.assertEqual((busy.model, busy.idle), ("b", False))  # type: ignore[union-attr]
        self.assertIsNone(self.view.likelyEviction("n", "a"), "resident: no load")
        self.probe(ps("a"))
        self.assertEqual(self.view.room("n"), 1)
        self.assertIsNone(self.view.likelyEviction("n", "c"))

    def test_expiryOrderWithoutOurUse(self) -> None:
        """Models we never used go in Ollama's ``expires_at`` order (sooner: used longer
        ago)."""
        early = ResidentModel("x", until="2030-01-01T00:00:00Z")
        late = ResidentModel("y", until="2030-01-01T00:01:00Z")
        self.probe(ps(late, early))
        self.probe(ps(late, ResidentModel("w")))
        self.probe(ps(late, early))
        self.assertEqual(self.view.likelyEviction("n", "z").model, "x")  # type: ignore[union-attr]

    def test_memoryFits(self) -> None:
        """Where sizes are reported, a load that fits in the most bytes seen at once evicts
        nothing, even past the most models seen."""
        gb = 1 << 30
        self.probe(ps(ResidentModel("big", vramBytes=8 * gb)), node="n")
        self.probe(ps(ResidentModel("small", vramBytes=2 * gb)), node="m")
        self.probe(ps(ResidentModel("mid", vramBytes=4 * gb)), node="n")
        self.assertIsNone(self.view.likelyEviction("n", "small"))
        self.assertEqual(self.view.likelyEviction("n", "big").model, "mid")  # type: ignore[union-attr]

    def test_demand(self) -> None:
        """Requests per minute per node (as they start there) and fleet-wide (as they
        arrive, waiting or not), decaying."""
        self.probe(ps("a"))
        for _ in range(6):
            self.view.requested("a")
            self.view.began("n", "a")
        self.view.requested("a")
        self.view.began("m", "a")
        self.view.requested("a")  # waits (for a load, in the queue): started nowhere yet
        self.assertAlmostEqual(self.view.demand("a", "n"), 6.0)
        self.assertAlmostEqual(self.view.demand("a", "m"), 1.0)
        self.assertAlmostEqual(self.view.demand("a"), 8.0)
        self.clock.advance(600)
        self.assertLess(self.view.demand("a"), 0.01)
        self.assertEqual(self.view.demand("zz", "nowhere"), 0.0)


@implementer(IModelActions)
class RecordedActions:
    """Model actions that record the unloads asked (allowed on node ``n`` only)."""

    def __init__(self) -> None:
        self.unloads: list[tuple[str, str]] = []

    def allowsUnload(self, nodeId: str) -> bool:
        return nodeId == "n"

    def unload(self, nodeId: str, model: str) -> Deferred[bool]:
        self.unloads.append((nodeId, model))
        return succeed(True)


class PredictedEvictionTests(ResidencyCase):
    """What a load of ours will likely evict, from the moment it starts."""

    def test_victimColdFromTheStart(self) -> None:
        """On a node seen full, a load of ours makes its likely victim ``cold`` at once
        (requests for it go elsewhere), unloaded through the engine's API first where the
        fleet file allows; a probe listing it ``EVICTION_SETTLE`` s later says the engine
        had room after all."""
        actions = self.view.actions = RecordedActions()
        for node in ("n", "m"):
            self.probe(ps("a", "b"), node=node)
            self.probe(ps("a", "x"), node=node)
        self.view.loadStarted("n", "c")
        self.assertIs(self.view.state("n", "a"), ModelState.COLD)
        self.assertEqual(self.view.holders("a"), ("m",))
        self.view.loadStarted("m", "c")
        self.assertEqual(actions.unloads, [("n", "a")], "only where unload_idle allows")
        self.probe(ps("a", "x", "c"), node="m", advance=EVICTION_SETTLE)
        self.assertIs(self.view.state("m", "a"), ModelState.LOADED)

    def test_busyCopyDrains(self) -> None:
        """Every resident model busy: the likely victim is the busy copy of a model resident
        elsewhere with the least fleet demand per copy, not the least recently used only
        copy; a load of ours makes it ``cold`` there at once (it drains: no request of ours
        goes to it, and it is never unloaded while busy), a probe still listing it keeps
        the mark while one of ours runs on it, and ``EVICTION_SETTLE`` s after the last
        ended says the engine had room after all."""
        actions = self.view.actions = RecordedActions()
        self.probe(ps("a", "b"))
        self.probe(ps("a", "x"))
        self.probe(ps("a", "b"))
        self.probe(ps("b"), node="m")
        self.view.began("n", "a")  # a: used longest ago, the only copy
        self.clock.advance(1)
        self.view.began("n", "b")  # b: resident on m too
        eviction = self.view.likelyEviction("n", "c")
        self.assertEqual((eviction.model, eviction.idle, eviction.copies), ("b", False, 2))  # type: ignore[union-attr]
        self.view.loadStarted("n", "c")
        self.assertIs(self.view.state("n", "b"), ModelState.COLD)
        self.assertEqual(self.view.holders("b"), ("m",))
        self.assertEqual(actions.unloads, [], "a busy model is never unloaded")
        self.probe(ps("a", "b"), advance=EVICTION_SETTLE * 4)
        self.assertIs(self.view.state("n", "b"), ModelState.COLD, "ours still runs on it")
        self.view.ended("n", "b")
        self.probe(ps("a", "b"), advance=EVICTION_SETTLE / 2)
        self.assertIs(self.view.state("n", "b"), ModelState.COLD, "just drained")
        self.probe(ps("a", "b"), advance=EVICTION_SETTLE)
        self.assertIs(self.view.state("n", "b"), ModelState.LOADED, "the engine had room")

    def test_busyOnlyCopyMovesToRoom(self) -> None:
        """A busy only copy drains too when another node has room for it (fewer models
        than it can hold, or than another was seen holding): its next request loads it
        there."""
        self.probe(ps("a", "b"))
        self.probe(ps("a", "x"))
        self.probe(ps("a", "b"))
        self.probe(ps("y"), node="m")
        self.view.began("n", "a")
        self.clock.advance(1)
        self.view.began("n", "b")
        self.assertTrue(self.view.roomElsewhere("n"))
        self.assertFalse(self.view.roomElsewhere("m"))
        self.view.loadStarted("n", "c")
        self.assertIs(self.view.state("n", "a"), ModelState.COLD)
        self.assertIs(self.view.state("n", "b"), ModelState.LOADED)

    def test_onlyCopiesBusy(self) -> None:
        """Every resident model busy and each the only copy, no room elsewhere: the least
        recently used one (the load waits), and no mark: its requests still go there."""
        self.probe(ps("a", "b"))
        self.probe(ps("a", "x"))
        self.probe(ps("a", "b"))
        self.view.began("n", "a")
        self.clock.advance(1)
        self.view.began("n", "b")
        eviction = self.view.likelyEviction("n", "c")
        self.assertEqual((eviction.model, eviction.idle, eviction.copies), ("a", False, 1))  # type: ignore[union-attr]
        self.view.loadStarted("n", "c")
        self.assertIs(self.view.state("n", "a"), ModelState.LOADED)


class ParallelTests(ResidencyCase):
    """How many requests a node runs at once, for engines that report no slots."""

    def test_sources(self) -> None:
        """The fleet file's limit, else LM Studio's instance ``parallel``, else learnt."""
        self.probe(EngineReport(resident=(ResidentModel("q", parallel=4),)), node="lms")
        self.assertEqual(self.view.parallel("lms", "q"), 4)
        self.ledger.configure("lms", 2)
        self.assertEqual(self.view.parallel("lms", "q"), 2)
        self.assertIsNone(self.view.parallel("o", "m"))
        for running, wait in ((1, 0.01), (2, 0.02), (3, 4.0)):
            for _ in range(3):
                self.view.concurrency.observe("o", running, wait)
        self.assertEqual(self.view.parallel("o", "m"), 2)

    def test_modelFull(self) -> None:
        """A model's own slots are full when ours for it there reach its instance's figure
        (LM Studio), else the learnt one; another model on the node is not; nothing known,
        never full."""
        self.probe(EngineReport(resident=(ResidentModel("q", parallel=1), ResidentModel("r"))))
        self.assertFalse(self.view.modelFull("n", "q"))
        self.view.began("n", "q")
        self.assertTrue(self.view.modelFull("n", "q"))
        self.view.began("n", "r")
        self.assertFalse(self.view.modelFull("n", "r"))  # r: nothing known
        for running, wait in ((1, 0.01), (2, 4.0)):
            for _ in range(3):
                self.view.concurrency.observe("n", running, wait)
        self.assertTrue(self.view.modelFull("n", "r"))  # learnt: one per model
        self.assertEqual(self.view.nodeParallel("n"), 2)  # one per model, two held


class BoundTests(ResidencyCase):
    """Every table has a bound; the counts stay consistent whatever the engine says."""

    def test_bounded(self) -> None:
        """Nodes past the bound are not tracked; events keep the latest."""
        view = Residency(self.clock, self.states, self.ledger, maxNodes=2)
        self.views.append(view)
        for node in ("a", "b", "c"):
            self.probe(ps("m"), node=node)
        self.assertEqual(sorted(view.snapshot()["nodes"]), ["a", "b"])  # type: ignore[call-overload]
        for i in range(MAX_EVENTS + 5):
            self.probe(ps(f"m{i}"), node="a")
        self.assertEqual(len(view._nodes["a"].events), MAX_EVENTS)
        view.forget("a")
        self.assertIs(view.state("a", "m"), ModelState.UNKNOWN)

    @settings(max_examples=100)
    @given(st.lists(st.frozensets(st.sampled_from("abcdef")), min_size=1, max_size=12))
    def test_countsAddUp(self, sequence: list[frozenset[str]]) -> None:
        """Loads less models gone equals the change in what is held."""
        self.setUp()
        for held in sequence:
            self.probe(ps(*sorted(held)))
        status = self.view.nodeStatus("n")
        gone = sum(status[k] for k in ("evictions", "expired", "unloaded"))  # type: ignore[misc]
        self.assertEqual(status["loads"] - gone, len(sequence[-1]) - len(sequence[0]))  # type: ignore[operator]
        self.assertEqual(status["capacity"] or 0, max(len(s) for s in sequence))
