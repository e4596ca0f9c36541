"""Placement by cached prefix, room and loaded models (``choose``, ``Affinity``)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nvpair.proxy.nodestate.interfaces import IEngineStates
from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.probes import EngineReport
from nvpair.proxy.nodestate.states import EngineStates
from nvpair.proxy.placement.affinity import requestServed
from nvpair.proxy.placement.choose import (
    CHARS_PER_TOKEN,
    DEFAULT_MS_PER_TOKEN,
    MIN_MATCH_SECONDS,
    Hold,
    Placed,
    confirmedMiss,
    holdBudget,
)
from nvpair.proxy.placement.keys import keyFor
from tests.support.cases.placementfleet import (
    CHAT,
    NODES,
    RECOMPUTE_CHARS,
    Fleet,
    request,
    tenantPrompt,
)


class PrefixTests(SynchronousTestCase):
    """Requests sharing a prefix go where it is cached; new prefix families spread."""

    def test_tenantUsersGroup(self) -> None:
        """Two users of one tenant (same system prompt, different questions) land on one
        engine: the second matches the first's system-prompt blocks."""
        fleet = Fleet(states=False)
        first, result = fleet.place(request(tenantPrompt(1), "alice: how do I pay?"))
        self.assertIs(result, Placed.MISS)
        for user in ("bob: where is my parcel?", "carol: reset my password", "dan: hi"):
            node, result = fleet.place(request(tenantPrompt(1), user))
            self.assertEqual((node, result), (first, Placed.HIT))

    def test_newTenantsSpreadEvenly(self) -> None:
        """Twelve tenants arriving one at a time on four idle engines: three per engine."""
        fleet = Fleet(states=False)
        homes = Counter(fleet.place(request(tenantPrompt(t), "hello"))[0] for t in range(12))
        self.assertEqual(sorted(homes.values()), [3, 3, 3, 3])

    def test_laterTurnStaysHome(self) -> None:
        """A conversation's later turn goes back to the node that served the earlier one,
        even when another node holds the shared system prompt as well."""
        fleet = Fleet(states=False)
        system = tenantPrompt(3)
        key = request(system, "first question " * 30)
        home, _ = fleet.place(key)
        other = next(n for n in NODES if n.id != home)
        fleet.affinity.index.record(other.id, key.blocks[:1], key.ends[:1])
        doc = {
            "model": "m",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": "first question " * 30},
                {"role": "assistant", "content": "an answer"},
                {"role": "user", "content": "second"},
            ],
        }
        later = keyFor("llamacpp", "m", CHAT, doc)
        assert later is not None
        self.assertEqual(fleet.place(later), (home, Placed.HIT))

    def test_failoverRecordsWhereServed(self) -> None:
        """Blocks are recorded where a request is placed, and where it commits after a
        failover; the expectation of the placed node is dropped."""
        fleet = Fleet(states=False)
        index = fleet.affinity.index
        key = request(tenantPrompt(5), "q")
        placed, _ = fleet.place(key, serve=False)
        self.assertEqual(index.matches(key.blocks), {placed: len(key.blocks)})
        other = next(n.id for n in NODES if n.id != placed)
        fleet.affinity.served(key, other)
        self.assertEqual(
            index.matches(key.blocks), {placed: len(key.blocks), other: len(key.blocks)}
        )
        self.assertIsNone(key.expect)


class SlotTests(SynchronousTestCase):
    """Free slots as the engines report them decide between holding and moving."""

    def test_fullHolderWaitsForLongPrefix(self) -> None:
        """The prefix holder is full while others are free: a long cached prefix (more than
        ``RECOMPUTE_CHARS`` to recompute elsewhere) still waits there."""
        fleet = Fleet()
        key = request(tenantPrompt(1), "q")
        home, _ = fleet.place(key)
        for node in NODES:
            fleet.report(node.id, busy=2 if node.id == home else 0)
        self.assertGreater(key.ends[0], RECOMPUTE_CHARS)
        self.assertEqual(fleet.place(request(tenantPrompt(1), "other user")), (home, Placed.HIT))

    def test_fullHolderHeldInTheProxy(self) -> None:
        """Where the proxy can hold it, a request whose long prefix is on a full engine is
        held for that engine (nothing recorded or reserved), at most as long as recomputing
        takes; once the hold is spent it recomputes on a free owner; let out because the
        holder has room, it goes to the holder."""
        fleet = Fleet()
        assert fleet.states is not None
        home, _ = fleet.place(request(tenantPrompt(1), "q"))
        for node in NODES:
            fleet.report(node.id, busy=2 if node.id == home else 0)
        key = request(tenantPrompt(1), "other user")
        self.assertEqual(fleet.place(key, serve=False, hold=Hold.ALLOWED), (home, None))
        assert fleet.choice is not None
        self.assertEqual(fleet.choice.hold, holdBudget(key.ends[0], None))
        self.assertIsNone(key.placed)
        self.assertEqual(fleet.reservations.totalReserved(), 0)
        for node in NODES:
            fleet.states.served(node.id, 4000, 0, promptMs=3600.0)  # 0.9 ms a token
        fleet.place(key, serve=False, hold=Hold.ALLOWED)
        self.assertEqual(fleet.choice.hold, holdBudget(key.ends[0], 0.9))
        self.assertLess(fleet.choice.hold or 0.0, holdBudget(key.ends[0], None))
        again = request(tenantPrompt(1), "third user")
        self.assertEqual(fleet.place(again, serve=False, hold=Hold.ROOMY), (home, Placed.HIT))
        moved, result = fleet.place(key, serve=False, hold=Hold.SPENT)
        self.assertNotEqual(moved, home)
        self.assertIs(result, Placed.OVERRIDDEN)

    def test_spentHoldWhileCrowdedWaitsAtTheHolder(self) -> None:
        """A spent hold while other requests wait in the proxy goes to its full holder (to
        wait in its engine) instead of recomputing where a slot is free: one of those
        waiting is about to take that slot.  A request not yet held is still held, and one
        whose hold was spent with nobody else waiting still recomputes."""
        fleet = Fleet()
        home, _ = fleet.place(request(tenantPrompt(1), "q"))
        for node in NODES:
            fleet.report(node.id, busy=2 if node.id == home else 0)
        key = request(tenantPrompt(1), "other user")
        spent = fleet.place(key, serve=False, hold=Hold.SPENT, crowded=True)
        self.assertEqual(spent, (home, Placed.HIT))
        assert fleet.choice is not None
        self.assertIsNone(fleet.choice.hold)
        self.assertEqual(
            fleet.place(key, serve=False, hold=Hold.ALLOWED, crowded=True), (home, None)
        )
        moved, result = fleet.place(key, serve=False, hold=Hold.SPENT, crowded=False)
        self.assertEqual((moved != home, result), (True, Placed.OVERRIDDEN))

    def test_spentHoldCrowdedButSlotsUnknown(self) -> None:
        """Crowded, but the holder's room is not known (its engine reports no slots): the
        spent hold follows the usual rule."""
        fleet = Fleet(states=False)
        home, _ = fleet.place(request(tenantPrompt(2), "q"))
        key = request(tenantPrompt(2), "other user")
        expected = fleet.place(key, serve=False, hold=Hold.SPENT)
        self.assertEqual(fleet.place(key, serve=False, hold=Hold.SPENT, crowded=True), expected)

    def test_unknownSlotsNotHeld(self) -> None:
        """Without the engines' slots (load alone says the holder is busy) nothing is held:
        the long prefix waits there as before."""
        fleet = Fleet(states=False)
        home, _ = fleet.place(request(tenantPrompt(2), "q"))
        for _ in range(3):
            fleet.reservations.reserve(home)
        key = request(tenantPrompt(2), "other")
        self.assertEqual(fleet.place(key, hold=Hold.ALLOWED), (home, Placed.HIT))
        assert fleet.choice is not None
        self.assertIsNone(fleet.choice.hold)

    def test_knownFullByTheLedger(self) -> None:
        """An owner the ledger knows is full (our own requests fill what it reported) has
        no room: a short prefix moves, a long one is held."""
        fleet = Fleet()
        short = "Be brief. " * 80
        home, _ = fleet.place(request(short, "x"))
        for node in NODES:
            fleet.report(node.id, busy=0)
        fleet.ours[home] = 2
        moved, result = fleet.place(request(short, "y"))
        self.assertEqual((moved != home, result), (True, Placed.OVERRIDDEN))
        longHome, _ = fleet.place(request(tenantPrompt(4), "x"))
        fleet.ours[longHome] = 2
        key = request(tenantPrompt(4), "y")
        self.assertEqual(fleet.place(key, hold=Hold.ALLOWED, serve=False), (longHome, None))

    def test_fullHolderLosesShortPrefix(self) -> None:
        """A short cached prefix on a full node goes to an owner with a free slot; slots
        taken by clients the proxy does not see count (only the engine's state shows them)."""
        fleet = Fleet()
        short = "Be brief. " * 80  # 800 characters: worth a match, cheap to recompute
        home, _ = fleet.place(request(short, "x"))
        for node in NODES:
            fleet.report(node.id, busy=2 if node.id == home else 1)
        moved, result = fleet.place(request(short, "y"))
        self.assertNotEqual(moved, home)
        self.assertIs(result, Placed.OVERRIDDEN)

    def test_newTenantAvoidsFullEngines(self) -> None:
        """A new prompt family goes to an engine with a free slot while that keeps the
        families within ``ROOT_SLACK`` of even; beyond, evenness wins (it waits once, and
        its family stays spread)."""
        fleet = Fleet()
        for node in NODES:
            fleet.report(node.id, busy=2 if node.id != "C" else 1)
        placed = [fleet.place(request(tenantPrompt(t), "hi"), serve=False)[0] for t in range(6)]
        self.assertEqual(placed[:2], ["C", "C"])
        self.assertNotIn("C", placed[2:5])
        self.assertEqual(sorted(placed[2:5]), ["A", "B", "D"])

    def test_shortPromptsHaveNoFamily(self) -> None:
        """Prompts shorter than ``MIN_MATCH_CHARS`` sharing a one-line system prompt are not
        grouped: they spread by load and rendezvous as conversations always did."""
        fleet = Fleet(states=False)
        nodes = {fleet.place(request("be brief", f"topic {i}"))[0] for i in range(40)}
        self.assertEqual(nodes, {"A", "B", "C", "D"})

    def test_loadedModelFirst(self) -> None:
        """An engine that says the model is not loaded comes after one that has it."""
        fleet = Fleet()
        assert fleet.states is not None
        for node in NODES:
            loaded = frozenset({"m"}) if node.id == "D" else frozenset({"other"})
            fleet.states.record(node.id, EngineReport(loaded=loaded), 1.0, "/api/ps")
        self.assertEqual(fleet.place(request(tenantPrompt(9), "hi"))[0], "D")
        self.assertIs(fleet.states.modelLoaded("A", "m"), False)
        self.assertIsNone(fleet.states.modelLoaded("unknown", "m"))

    def test_staleStateIsUnknown(self) -> None:
        """A probe older than two intervals says nothing: unknown, never idle."""
        fleet = Fleet()
        assert fleet.states is not None and fleet.ledger is not None
        verifyObject(IEngineStates, fleet.states)
        fleet.report("A", busy=1, total=4)
        self.assertEqual(fleet.states.status()["A"]["slotsAvailable"], 3)
        fleet.clock.advance(2.1)
        self.assertIsNone(fleet.ledger.free("A"))
        self.assertEqual(fleet.states.status()["A"]["state"], "unknown")
        self.assertNotIn("slotsAvailable", fleet.states.status()["A"])

    def test_statesBounded(self) -> None:
        """More backends than the bound: the rest stay unknown, their counts unkept."""
        clock = Clock()
        states = EngineStates(clock, RoomLedger(clock, {}), maxNodes=3)
        for i in range(10):
            states.record(f"n{i}", EngineReport(busy=0, total=1, loaded=frozenset("m")), 1.0, "/x")
            states.served(f"n{i}", 100, 5, promptMs=9.5)
        self.assertEqual(sorted(states.status()), ["n0", "n1", "n2"])
        self.assertIsNone(states.modelLoaded("n9", "m"))
        self.assertIsNone(states.hitRatio("n9"))
        self.assertEqual((len(states.prefill), states.prefillMs("n9")), (3, None))

    def test_prefillTime(self) -> None:
        """The prefill time per evaluated token is a moving average of what the engine
        reported, over requests that evaluated enough tokens to say; shown in the status."""
        fleet = Fleet()
        assert fleet.states is not None
        states = fleet.states
        states.served("A", 1000, 900, promptMs=50.0)  # 100 evaluated: 0.5 ms a token
        self.assertEqual(states.prefillMs("A"), 0.5)
        states.served("A", 1000, 990, promptMs=500.0)  # 10 evaluated: too few to say
        states.served("A", 100, 0)  # no time reported
        self.assertEqual(states.prefillMs("A"), 0.5)
        states.served("A", 100, 0, promptMs=100.0)  # 1 ms a token
        self.assertAlmostEqual(states.prefillMs("A") or 0.0, 0.625)
        fleet.report("A", busy=0)
        self.assertEqual(states.status()["A"]["prefillMsPerToken"], 0.625)
        states.forget("A")
        self.assertIsNone(states.prefillMs("A"))


class MissTests(SynchronousTestCase):
    """The engine's cached count confirms or refutes what the index expected."""

    def test_confirmedMissRule(self) -> None:
        """Under half the expected cached share is a miss; near it, a hit."""
        self.assertTrue(confirmedMiss(2000, 2000, 500, 10))
        self.assertTrue(confirmedMiss(1000, 2000, 500, 124))
        self.assertFalse(confirmedMiss(1000, 2000, 500, 126))
        self.assertFalse(confirmedMiss(0, 100, 500, 0))

    def test_missDropsStaleEntries(self) -> None:
        """A confirmed miss on the expected node drops its entries for that prefix (and
        older), so the next request of that family is placed anew; a hit keeps them."""
        fleet = Fleet()
        assert fleet.states is not None
        affinity = fleet.affinity
        home, _ = fleet.place(request(tenantPrompt(1), "first " * 60))
        key = request(tenantPrompt(1), "second " * 60)
        self.assertEqual(fleet.place(key, serve=False)[0], home)
        affinity.served(key, home)
        exchange = SimpleNamespace(
            committedStatus=200,
            servedBy=home,
            workload=SimpleNamespace(stats={"promptTokens": 500, "cachedTokens": 450}),
            prefixKey=key,
        )
        requestServed(exchange, fleet.states, affinity)
        self.assertEqual((affinity.expectedHits, affinity.expectedMisses), (1, 0))
        key = request(tenantPrompt(1), "third " * 60)
        fleet.place(key)
        exchange.prefixKey = key
        exchange.workload.stats = {"promptTokens": 500, "cachedTokens": 0}
        requestServed(exchange, fleet.states, affinity)
        self.assertEqual((affinity.expectedHits, affinity.expectedMisses), (1, 1))
        self.assertGreater(affinity.index.dropped, 0)
        self.assertAlmostEqual(fleet.states.hitRatio(home) or 0, 450 / 1000)
        self.assertEqual(fleet.states.status()[home]["cachedTokens"], 450)


class TimeThresholdTests(SynchronousTestCase):
    """Whether a prefix counts and when a full holder is overridden follow from what
    recomputing costs on the engines (their reported prefill time), not from characters."""

    def slow(self, fleet: Fleet, msPerToken: float) -> None:
        assert fleet.states is not None
        for node in NODES:
            fleet.states.served(node.id, 1000, 0, promptMs=1000 * msPerToken)

    def test_shortSystemPromptsGroupOnSlowEngines(self) -> None:
        """A ~350-character system prompt (~90 tokens) is not worth grouping at the default
        rate, but on CPU engines at 7 ms a token (0.6 s to recompute) its users group."""
        system = "You answer questions about the tenant's parcels, politely and briefly. " * 5
        self.assertLess(len(system) / CHARS_PER_TOKEN * DEFAULT_MS_PER_TOKEN / 1000, 0.128)
        fleet = Fleet()
        first, _ = fleet.place(request(system, "question one " * 3))
        homes = {fleet.place(request(system, f"user {i} asks " * 3))[0] for i in range(8)}
        self.assertGreater(len(homes), 1)  # no family at the default rate: spread
        slow = Fleet()
        self.slow(slow, 7.0)
        first, _ = slow.place(request(system, "question one " * 3))
        for i in range(8):
            self.assertEqual(
                slow.place(request(system, f"user {i} asks " * 3)), (first, Placed.HIT)
            )

    def test_longPrefixIgnoredOnFastEngines(self) -> None:
        """On engines at 0.02 ms a token a 2.6k-character prefix costs 13 ms to recompute:
        below ``MIN_MATCH_SECONDS``, it does not pile users onto one node."""
        fleet = Fleet()
        self.slow(fleet, 0.02)
        self.assertLess(len(tenantPrompt(1)) / CHARS_PER_TOKEN * 0.02 / 1000, MIN_MATCH_SECONDS)
        homes = Counter(fleet.place(request(tenantPrompt(1), f"user {i}"))[1] for i in range(20))
        self.assertEqual(homes[Placed.HIT], 0)

    def test_overrideByTime(self) -> None:
        """A full holder of a prefix is overridden when recomputing it elsewhere costs at
        most ``RECOMPUTE_SECONDS`` there: an 800-character prefix is overridden at the
        default rate (0.2 s) but held for on a 7 ms-a-token engine (1.4 s)."""
        short = "Be brief. " * 80
        for rate, moves in ((None, True), (7.0, False)):
            fleet = Fleet()
            if rate is not None:
                self.slow(fleet, rate)
            home, _ = fleet.place(request(short, "x"))
            for node in NODES:
                fleet.report(node.id, busy=2 if node.id == home else 0)
            placed, result = fleet.place(request(short, "y"), hold=Hold.ALLOWED, serve=False)
            self.assertEqual(placed != home, moves)
            self.assertIs(result, Placed.OVERRIDDEN if moves else None)
