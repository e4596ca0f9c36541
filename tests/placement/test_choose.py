"""Placement by cached prefix, free slots and loaded models (``prefixplace``, ``Affinity``)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nvpair.proxy.nodestate.interfaces import IEngineStates
from nvpair.proxy.nodestate.probes import EngineReport
from nvpair.proxy.nodestate.states import MAX_LISTENERS, EngineStates
from nvpair.proxy.placement.affinity import Affinity, requestServed
from nvpair.proxy.placement.choose import (
    HOLD_DEFAULT,
    RECOMPUTE_CHARS,
    RESULTS,
    Hold,
    Placed,
    confirmedMiss,
)
from nvpair.proxy.placement.keys import AffinityKey, keyFor
from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.routing.reservations import ReservationMap

CHAT = b"/v1/chat/completions"
NODES = tuple(Node(n, False, (n,), frozenset({"m"})) for n in ("A", "B", "C", "D"))


def tenantPrompt(tenant: int) -> str:
    """A long system prompt of its own per tenant (about 2.6k characters)."""
    return f"You are the assistant of tenant {tenant}. Follow these rules carefully! " * 40


def request(system: str, user: str, model: str = "m") -> AffinityKey:
    doc = {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }
    key = keyFor("llamacpp", model, CHAT, doc)
    assert key is not None
    return key


class Fleet:
    """An ``Affinity`` over four owners with engine states fed by hand on a ``Clock``."""

    def __init__(self, states: bool = True) -> None:
        self.clock = Clock()
        self.reservations = ReservationMap()
        self.states = EngineStates(self.clock, self.reservations) if states else None
        self.affinity = Affinity(self.clock, states=self.states)

    def report(self, nodeId: str, busy: int, total: int = 2, **kw: object) -> None:
        assert self.states is not None
        self.states.record(nodeId, EngineReport(busy=busy, total=total, **kw), 1.0, "/slots")  # type: ignore[arg-type]

    def place(
        self,
        key: AffinityKey,
        serve: bool = True,
        model: str = "m",
        hold: Hold = Hold.NONE,
        full: tuple[Node, ...] = (),
    ) -> tuple[str, Placed | None]:
        """Where ``key`` goes and how (None: held for that node)."""
        before = list(self.affinity.counts.get("e", [0] * len(RESULTS)))
        node = self.affinity.place(list(NODES), key, self.reservations, "e", model, hold, full)
        assert node is not None
        after = self.affinity.counts.get("e", before)
        changed = [i for i in range(len(RESULTS)) if after[i] != before[i]]
        result = Placed(changed[0]) if changed else None
        if serve:
            self.affinity.served(key, node.id)
        return node.id, result


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
        self.assertEqual(key.hold, HOLD_DEFAULT)
        self.assertIsNone(key.placed)
        self.assertEqual(fleet.reservations.totalReserved(), 0)
        for node in NODES:
            fleet.states.served(node.id, 4000, 0, promptMs=400.0)
        fleet.place(key, serve=False, hold=Hold.ALLOWED)
        self.assertLess(key.hold or 0.0, HOLD_DEFAULT)  # 0.1 ms a token: a short hold
        again = request(tenantPrompt(1), "third user")
        self.assertEqual(fleet.place(again, serve=False, hold=Hold.ROOMY), (home, Placed.HIT))
        moved, result = fleet.place(key, serve=False, hold=Hold.SPENT)
        self.assertNotEqual(moved, home)
        self.assertIs(result, Placed.OVERRIDDEN)
        self.assertIsNone(key.hold)

    def test_unknownSlotsNotHeld(self) -> None:
        """Without the engines' slots (load alone says the holder is busy) nothing is held:
        the long prefix waits there as before."""
        fleet = Fleet(states=False)
        home, _ = fleet.place(request(tenantPrompt(2), "q"))
        for _ in range(3):
            fleet.reservations.reserve(home)
        key = request(tenantPrompt(2), "other")
        self.assertEqual(fleet.place(key, hold=Hold.ALLOWED), (home, Placed.HIT))
        self.assertIsNone(key.hold)

    def test_knownFullByTheQueue(self) -> None:
        """An owner the queue knows is full (say, our requests at its learnt limit) has no
        room whatever its engine last reported: a short prefix moves, a long one is held."""
        fleet = Fleet()
        short = "Be brief. " * 80
        home, _ = fleet.place(request(short, "x"))
        for node in NODES:
            fleet.report(node.id, busy=0)
        full = tuple(n for n in NODES if n.id == home)
        moved, result = fleet.place(request(short, "y"), full=full)
        self.assertEqual((moved != home, result), (True, Placed.OVERRIDDEN))
        longHome, _ = fleet.place(request(tenantPrompt(4), "x"))
        full = tuple(n for n in NODES if n.id == longHome)
        key = request(tenantPrompt(4), "y")
        self.assertEqual(
            fleet.place(key, hold=Hold.ALLOWED, full=full, serve=False), (longHome, None)
        )

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

    def test_reservationsFillTheGap(self) -> None:
        """Our own requests started since a probe use up the free slots it reported."""
        fleet = Fleet()
        assert fleet.states is not None
        fleet.report("A", busy=0, total=2)
        self.assertEqual(fleet.states.availableSlots("A"), 2)
        fleet.reservations.reserve("A")
        fleet.reservations.reserve("A")
        self.assertEqual(fleet.states.availableSlots("A"), 0)
        self.assertEqual(fleet.states.freeSlots("A"), 2)
        fleet.report("A", busy=2, total=2)
        self.assertEqual(fleet.states.availableSlots("A"), 0)
        fleet.report("A", busy=1, total=2)
        self.assertEqual(fleet.states.availableSlots("A"), 1)
        self.assertEqual(fleet.states.roomAndLoaded("A", "m"), (1, None))
        fleet.clock.advance(2.5)
        self.assertEqual(fleet.states.roomAndLoaded("A", "m"), (None, None))

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
        assert fleet.states is not None
        verifyObject(IEngineStates, fleet.states)
        fleet.report("A", busy=1, total=4)
        self.assertEqual(fleet.states.freeSlots("A"), 3)
        fleet.clock.advance(2.0)
        self.assertEqual(fleet.states.totalSlots("A"), 4)
        fleet.clock.advance(0.1)
        self.assertIsNone(fleet.states.freeSlots("A"))
        self.assertIsNone(fleet.states.totalSlots("A"))
        self.assertEqual(fleet.states.status()["A"]["state"], "unknown")

    def test_subscribe(self) -> None:
        """Listeners hear of each fresh probe (not of a failed one) until they unsubscribe;
        their number is bounded."""
        fleet = Fleet()
        assert fleet.states is not None
        heard: list[str] = []
        unsubscribe = fleet.states.subscribe(heard.append)
        fleet.report("A", busy=1)
        fleet.states.record("B", None, 1.0, "/slots", "timed out")
        unsubscribe()
        fleet.report("C", busy=1)
        self.assertEqual(heard, ["A"])
        for _ in range(MAX_LISTENERS):
            fleet.states.subscribe(heard.append)
        self.assertRaises(ValueError, fleet.states.subscribe, heard.append)

    def test_statesBounded(self) -> None:
        """More backends than the bound: the rest stay unknown, their counts unkept."""
        clock = Clock()
        states = EngineStates(clock, ReservationMap(), maxNodes=3)
        for i in range(10):
            states.record(f"n{i}", EngineReport(busy=0, total=1), 1.0, "/slots")
            states.served(f"n{i}", 100, 5, promptMs=9.5)
        self.assertEqual(sorted(states.status()), ["n0", "n1", "n2"])
        self.assertIsNone(states.freeSlots("n9"))
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
            committed=SimpleNamespace(node=SimpleNamespace(id=home)),
            workload=SimpleNamespace(stats={"promptTokens": 500, "cachedTokens": 450}),
            prefixKey=key,
        )
        requestServed(exchange, fleet.states, affinity)
        self.assertEqual(affinity.confirmed, [1, 0])
        key = request(tenantPrompt(1), "third " * 60)
        fleet.place(key)
        exchange.prefixKey = key
        exchange.workload.stats = {"promptTokens": 500, "cachedTokens": 0}
        requestServed(exchange, fleet.states, affinity)
        self.assertEqual(affinity.confirmed, [1, 1])
        self.assertGreater(affinity.index.dropped, 0)
        self.assertAlmostEqual(fleet.states.hitRatio(home) or 0, 450 / 1000)
        self.assertEqual(fleet.states.status()[home]["cachedTokens"], 450)
