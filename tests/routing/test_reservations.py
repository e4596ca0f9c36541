"""Tests for nvpair.proxy.routing.reservations: the scheduler snapshot and the reservation map."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.routing.reservations import NodeLoad, Reservation, ReservationMap, parsePriority


class ParsePriorityTests(SynchronousTestCase):
    """``parsePriority`` validates ``node/set-priority`` params."""

    def test_good(self) -> None:
        """A well-formed snapshot parses to (generation, order, load), ignoring unknown fields."""
        generation, order, load = parsePriority(
            {
                "generation": 7,
                "order": ["b", "a"],
                "load": {
                    "a": {"pending": 2, "gpuPressure": 0.5},
                    "b": {"pending": 0, "gpuPressure": 1},
                },
                "extra": True,
            }
        )
        self.assertEqual(generation, 7)
        self.assertEqual(order, ("b", "a"))
        self.assertEqual(load, {"a": NodeLoad(2, 0.5), "b": NodeLoad(0, 1.0)})
        self.assertIsInstance(load["b"].gpuPressure, float)

    def test_loadOptional(self) -> None:
        """``load`` may be absent or omit listed nodes."""
        self.assertEqual(parsePriority({"generation": 1, "order": ["a"]}), (1, ("a",), {}))
        self.assertEqual(
            parsePriority({"generation": 1, "order": ["a", "b"], "load": {}}), (1, ("a", "b"), {})
        )

    def test_bad(self) -> None:
        """Each wrong shape raises ValueError naming the field and never echoing the value."""
        cases: list[tuple[object, str]] = [
            ([], "params"),
            ({"order": []}, "generation"),
            ({"generation": True, "order": []}, "generation"),
            ({"generation": 1.0, "order": []}, "generation"),
            ({"generation": "secret-1", "order": []}, "generation"),
            ({"generation": 1}, "order"),
            ({"generation": 1, "order": "secret-a"}, "order"),
            ({"generation": 1, "order": [5]}, "order[0]"),
            ({"generation": 1, "order": [], "load": ["secret-x"]}, "load"),
            ({"generation": 1, "order": [], "load": {"a": 3}}, "load entry"),
            ({"generation": 1, "order": [], "load": {"a": {"gpuPressure": 0}}}, "pending"),
            (
                {"generation": 1, "order": [], "load": {"a": {"pending": False, "gpuPressure": 0}}},
                "pending",
            ),
            (
                {"generation": 1, "order": [], "load": {"a": {"pending": 1.5, "gpuPressure": 0}}},
                "pending",
            ),
            ({"generation": 1, "order": [], "load": {"a": {"pending": 1}}}, "gpuPressure"),
            (
                {"generation": 1, "order": [], "load": {"a": {"pending": 1, "gpuPressure": True}}},
                "gpuPressure",
            ),
            (
                {
                    "generation": 1,
                    "order": [],
                    "load": {"a": {"pending": 1, "gpuPressure": "secret-p"}},
                },
                "gpuPressure",
            ),
            (
                {
                    "generation": 1,
                    "order": [],
                    "load": {"a": {"pending": 1, "gpuPressure": float("nan")}},
                },
                "gpuPressure",
            ),
        ]
        for raw, field in cases:
            with self.assertRaises(ValueError, msg=repr(raw)) as caught:
                parsePriority(raw)
            message = str(caught.exception)
            self.assertIn(field, message)
            self.assertNotIn("secret", message)


class ApplyPriorityTests(SynchronousTestCase):
    """``applyPriority`` applies each generation at most once, newest only."""

    def test_initial(self) -> None:
        """Before any snapshot there is no generation, no order, and every node is listed."""
        m = ReservationMap()
        self.assertIsNone(m.generation)
        self.assertEqual(m.order, ())
        self.assertEqual(dict(m.rank), {})
        self.assertTrue(m.isListed("anything"))
        self.assertEqual(m.estimatedLoad("anything"), 0)

    def test_firstApplies(self) -> None:
        """The first snapshot always applies, whatever its generation, and sets order/rank."""
        m = ReservationMap()
        self.assertTrue(m.applyPriority(-5, ["b", "a", "b"], {}))
        self.assertEqual(m.generation, -5)
        self.assertEqual(m.order, ("b", "a", "b"))
        self.assertEqual(dict(m.rank), {"b": 0, "a": 1})
        self.assertTrue(m.isListed("a"))
        self.assertFalse(m.isListed("c"))

    def test_newerApplies(self) -> None:
        """A newer generation replaces order, rank and load."""
        m = ReservationMap()
        m.applyPriority(1, ["a"], {"a": NodeLoad(3, 0.5)})
        self.assertTrue(m.applyPriority(2, ["c"], {"c": NodeLoad(1, 0.0)}))
        self.assertEqual(m.generation, 2)
        self.assertEqual(dict(m.rank), {"c": 0})
        self.assertEqual(m.estimatedLoad("a"), 0)
        self.assertEqual(m.estimatedLoad("c"), 1)

    def test_redeliveredIgnored(self) -> None:
        """A redelivered generation changes nothing and keeps live reservations."""
        m = ReservationMap()
        m.applyPriority(3, ["a"], {"a": NodeLoad(1, 0.0)})
        m.reserve("a")
        rankBefore = m.rank
        self.assertFalse(m.applyPriority(3, ["b"], {"b": NodeLoad(9, 9.0)}))
        self.assertIs(m.rank, rankBefore)
        self.assertEqual(m.order, ("a",))
        self.assertEqual(m.reservedCount("a"), 1)
        self.assertEqual(m.estimatedLoad("a"), 2)
        self.assertEqual(m.estimatedLoad("b"), 0)

    def test_olderIgnored(self) -> None:
        """An older generation is ignored, reservations included."""
        m = ReservationMap()
        m.applyPriority(5, ["a"], {})
        m.reserve("a")
        self.assertFalse(m.applyPriority(4, ["b"], {}))
        self.assertEqual(m.generation, 5)
        self.assertEqual(m.byNode(), {"a": 1})

    def test_rankIdentity(self) -> None:
        """The rank mapping object is kept when the order is unchanged and replaced otherwise."""
        m = ReservationMap()
        m.applyPriority(1, ["a", "b"], {})
        first = m.rank
        m.applyPriority(2, ["a", "b"], {"a": NodeLoad(1, 0.0)})
        self.assertIs(m.rank, first)
        m.applyPriority(3, ["b", "a"], {})
        self.assertIsNot(m.rank, first)
        self.assertEqual(dict(m.rank), {"b": 0, "a": 1})
        self.assertEqual(dict(first), {"a": 0, "b": 1})

    def test_loadSorted(self) -> None:
        """loadSorted lists the scheduler's nodes by base load, then rank, per snapshot."""
        m = ReservationMap()
        self.assertEqual(m.loadSorted(), [])
        m.applyPriority(1, ["a", "b", "c"], {"a": NodeLoad(1, 0.5), "x": NodeLoad(0, 0.0)})
        self.assertEqual(m.loadSorted(), [(0.0, 1, "b"), (0.0, 2, "c"), (1.5, 0, "a")])
        m.reserve("b")
        self.assertEqual(m.loadSorted()[0], (0.0, 1, "b"))
        m.applyPriority(2, ["a", "b", "c"], {"b": NodeLoad(2, 0.0)})
        self.assertEqual(m.loadSorted(), [(0.0, 0, "a"), (0.0, 2, "c"), (2.0, 1, "b")])

    def test_estimatedLoad(self) -> None:
        """Estimated load is pending + gpuPressure + live reservations."""
        m = ReservationMap()
        m.applyPriority(1, ["a"], {"a": NodeLoad(2, 0.25)})
        m.reserve("a")
        m.reserve("a")
        self.assertEqual(m.estimatedLoad("a"), 4.25)
        self.assertEqual(m.baseLoad("a"), 2.25)


class ReorderTests(SynchronousTestCase):
    """``reorder``: a standalone fleet reload changes the order and nothing else."""

    def test_reorderKeepsReservations(self) -> None:
        """New nodes are listed and ranked; the generation, the scheduler's load and live
        reservations stay, and a release after the reorder still counts down."""
        m = ReservationMap()
        m.applyPriority(0, ["a", "b"], {"a": NodeLoad(1, 0.5)})
        held = m.reserve("a")
        rank = m.rank
        m.reorder(["b", "c", "a", "c"])
        self.assertEqual((m.generation, m.order), (0, ("b", "c", "a", "c")))
        self.assertEqual(dict(m.rank), {"b": 0, "c": 1, "a": 2})
        self.assertIsNot(m.rank, rank)  # a new version for the ordering caches
        self.assertTrue(m.isListed("c"))
        self.assertFalse(m.isListed("d"))
        self.assertEqual(m.estimatedLoad("a"), 2.5)
        self.assertEqual([n for _, _, n in m.loadSorted()], ["b", "c", "a"])
        held.release()
        self.assertEqual(m.estimatedLoad("a"), 1.5)

    def test_sameOrderKeepsRank(self) -> None:
        """An unchanged order keeps its rank object (cached orderings stay valid)."""
        m = ReservationMap()
        m.applyPriority(0, ["a", "b"], {})
        rank = m.rank
        m.reorder(["a", "b"])
        self.assertIs(m.rank, rank)


class ReservationTests(SynchronousTestCase):
    """Reservations are stamped, superseded, moved and released per spec §6."""

    def test_reserveCounts(self) -> None:
        """Reserving counts per node and in total, stamped with the current generation."""
        m = ReservationMap()
        r1 = m.reserve("a")
        self.assertIsInstance(r1, Reservation)
        self.assertEqual((r1.nodeId, r1.generation), ("a", None))
        m.applyPriority(4, [], {})
        r2 = m.reserve("a")
        m.reserve("b")
        self.assertEqual(r2.generation, 4)
        self.assertEqual(m.byNode(), {"a": 1, "b": 1})
        self.assertEqual(m.totalReserved(), 2)

    def test_supersede(self) -> None:
        """A newer snapshot makes earlier reservations vanish from the estimate."""
        m = ReservationMap()
        m.applyPriority(1, ["a"], {})
        m.reserve("a")
        m.reserve("a")
        self.assertEqual(m.estimatedLoad("a"), 2)
        m.applyPriority(2, ["a"], {"a": NodeLoad(2, 0.0)})
        self.assertEqual(m.reservedCount("a"), 0)
        self.assertEqual(m.totalReserved(), 0)
        self.assertEqual(m.byNode(), {})
        self.assertEqual(m.estimatedLoad("a"), 2)

    def test_firstSnapshotSupersedesStandalone(self) -> None:
        """Reservations taken before any snapshot are superseded by the first one."""
        m = ReservationMap()
        r = m.reserve("a")
        m.applyPriority(0, ["a"], {})
        self.assertEqual(m.byNode(), {})
        r.release()
        self.assertEqual(m.byNode(), {})

    def test_staleReleaseDropped(self) -> None:
        """Releasing a superseded reservation leaves newer counts alone (never negative)."""
        m = ReservationMap()
        m.applyPriority(1, ["a"], {})
        old = m.reserve("a")
        m.applyPriority(2, ["a"], {})
        new = m.reserve("a")
        old.release()
        self.assertEqual(m.reservedCount("a"), 1)
        self.assertIsNone(old.nodeId)
        new.release()
        self.assertEqual(m.reservedCount("a"), 0)
        self.assertEqual(m.byNode(), {})
        self.assertEqual(m.totalReserved(), 0)

    def test_releaseIdempotent(self) -> None:
        """A second release changes nothing, even with other claims on the same node."""
        m = ReservationMap()
        r = m.reserve("a")
        m.reserve("a")
        r.release()
        r.release()
        self.assertEqual(m.reservedCount("a"), 1)
        self.assertIsNone(r.nodeId)

    def test_zeroEntriesRemoved(self) -> None:
        """byNode is empty once everything is released."""
        m = ReservationMap()
        rs = [m.reserve(n) for n in "abca"]
        for r in rs:
            r.release()
        self.assertEqual(m.byNode(), {})
        self.assertEqual(m.totalReserved(), 0)

    def test_byNodeIsCopy(self) -> None:
        """Mutating byNode's result does not change the map."""
        m = ReservationMap()
        m.reserve("a")
        m.byNode()["a"] = 10
        self.assertEqual(m.reservedCount("a"), 1)

    def test_moveTo(self) -> None:
        """moveTo releases the old claim and claims the new node."""
        m = ReservationMap()
        m.applyPriority(1, [], {})
        r = m.reserve("a")
        r.moveTo("b")
        self.assertEqual(r.nodeId, "b")
        self.assertEqual(r.generation, 1)
        self.assertEqual(m.byNode(), {"b": 1})
        r.release()
        self.assertEqual(m.byNode(), {})

    def test_moveToSameNode(self) -> None:
        """Moving to the node already held at the current generation is a no-op."""
        m = ReservationMap()
        r = m.reserve("a")
        r.moveTo("a")
        self.assertEqual(m.byNode(), {"a": 1})
        self.assertEqual(m.totalReserved(), 1)

    def test_moveToAfterSupersede(self) -> None:
        """Moving a superseded claim drops the old count and claims at the current generation."""
        m = ReservationMap()
        m.applyPriority(1, [], {})
        r = m.reserve("a")
        other = m.reserve("x")
        m.applyPriority(2, [], {})
        keep = m.reserve("a")
        r.moveTo("a")
        self.assertEqual(r.generation, 2)
        self.assertEqual(m.byNode(), {"a": 2})
        r.moveTo("b")
        self.assertEqual(m.byNode(), {"a": 1, "b": 1})
        other.moveTo("b")
        self.assertEqual(m.byNode(), {"a": 1, "b": 2})
        for each in (r, keep, other):
            each.release()
        self.assertEqual(m.byNode(), {})

    def test_moveToAfterRelease(self) -> None:
        """A released reservation stays released: moveTo does nothing."""
        m = ReservationMap()
        r = m.reserve("a")
        r.release()
        r.moveTo("b")
        self.assertIsNone(r.nodeId)
        self.assertEqual(m.byNode(), {})


_NODES = st.sampled_from(["a", "b", "c"])
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), _NODES),
        st.tuples(st.just("move"), st.integers(0, 20), _NODES),
        st.tuples(st.just("release"), st.integers(0, 20)),
        st.tuples(st.just("apply"), st.integers(-2, 6)),
    ),
    max_size=60,
)


class ReservationPropertyTests(SynchronousTestCase):
    """Any interleaving of operations keeps the map consistent."""

    @settings(max_examples=300, deadline=None)
    @given(_OPS)
    def test_interleavings(self, ops: list[tuple[object, ...]]) -> None:
        """Counts stay >= 0, match the live current-generation claims, and end empty."""
        m = ReservationMap()
        held: list[Reservation] = []
        for op in ops:
            if op[0] == "reserve":
                held.append(m.reserve(str(op[1])))
            elif op[0] == "move" and held:
                held[int(str(op[1])) % len(held)].moveTo(str(op[2]))
            elif op[0] == "release" and held:
                held[int(str(op[1])) % len(held)].release()
            elif op[0] == "apply":
                m.applyPriority(int(str(op[1])), ["a", "b"], {})
            expected: dict[str, int] = {}
            for r in held:
                if r.nodeId is not None and r.generation == m.generation:
                    expected[r.nodeId] = expected.get(r.nodeId, 0) + 1
            counts = m.byNode()
            self.assertTrue(all(v > 0 for v in counts.values()))
            self.assertEqual(counts, expected)
            self.assertEqual(m.totalReserved(), sum(counts.values()))
            for node in "abc":
                self.assertGreaterEqual(m.reservedCount(node), 0)
                self.assertGreaterEqual(m.estimatedLoad(node), 0)
        for r in held:
            r.release()
        self.assertEqual(m.byNode(), {})
        self.assertEqual(m.totalReserved(), 0)
