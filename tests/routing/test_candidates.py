"""Tests for routing.candidates: owner index, candidate order and reservation placement."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.routing.candidates import EMPTY, Snapshot, orderCandidates, placeReservation
from nvpair.proxy.routing.nodes import Node
from nvpair.proxy.routing.reservations import NodeLoad, ReservationMap


def ollama(model: str) -> str:
    """Ollama's normalization: a name without a tag means ``name:latest``."""
    return model if ":" in model else model + ":latest"


def node(nodeId: str, *models: str, isSelf: bool = False) -> Node:
    """A node with no addresses advertising ``models``."""
    return Node(nodeId, isSelf, (), frozenset(models))


def ids(nodes: Sequence[Node]) -> list[str]:
    """The ids of ``nodes``, in order."""
    return [n.id for n in nodes]


class SnapshotTests(SynchronousTestCase):
    """``Snapshot`` indexes owners per normalized model."""

    def test_defaultOrder(self) -> None:
        """Nodes are in default order: the self node first, then by id."""
        snap = Snapshot([node("c"), node("b"), node("z", isSelf=True), node("a")], ollama)
        self.assertEqual(ids(snap.nodes), ["z", "a", "b", "c"])

    def test_lookup(self) -> None:
        """get, membership and length reflect the nodes, keeping the first of a repeated id."""
        first = node("a", "m")
        snap = Snapshot([first, node("b"), node("a", "other")], ollama)
        self.assertIs(snap.get("a"), first)
        self.assertIsNone(snap.get("x"))
        self.assertIn("b", snap)
        self.assertNotIn("x", snap)
        self.assertEqual(len(snap), 2)

    def test_empty(self) -> None:
        """EMPTY has no nodes and no owners."""
        self.assertEqual(len(EMPTY), 0)
        self.assertEqual(EMPTY.nodes, ())
        self.assertEqual(EMPTY.owners("m", True), ())

    def test_ollamaNormalization(self) -> None:
        """``llama3`` and ``llama3:latest`` match each other whichever side omits the tag."""
        snap = Snapshot(
            [node("a", "llama3"), node("b", "llama3:latest"), node("c", "llama3:8b")], ollama
        )
        self.assertEqual(ids(snap.owners(ollama("llama3"), True)), ["a", "b"])
        self.assertEqual(ids(snap.owners(ollama("llama3:latest"), True)), ["a", "b"])
        self.assertEqual(ids(snap.owners(ollama("llama3:8b"), True)), ["c"])
        self.assertEqual(snap.owners(ollama("mistral"), True), ())

    def test_twoSpellingsOneNode(self) -> None:
        """A node advertising both spellings of one model is an owner once."""
        snap = Snapshot([node("a", "llama3", "llama3:latest")], ollama)
        self.assertEqual(ids(snap.owners("llama3:latest", True)), ["a"])

    def test_exactMatch(self) -> None:
        """With identity normalization ids match exactly."""
        snap = Snapshot([node("a", "llama3")], lambda m: m)
        self.assertEqual(snap.owners("llama3:latest", True), ())
        self.assertEqual(ids(snap.owners("llama3", True)), ["a"])

    def test_ownersDefaultOrder(self) -> None:
        """Owners are in default order, self first."""
        snap = Snapshot([node("b", "m"), node("s", "m", isSelf=True), node("a", "m")], ollama)
        self.assertEqual(ids(snap.owners("m:latest", True)), ["s", "a", "b"])

    def test_selfWithoutLocalBackend(self) -> None:
        """A self node is not an owner when there is no local backend."""
        snap = Snapshot([node("b", "m"), node("s", "m", "n", isSelf=True)], ollama)
        self.assertEqual(ids(snap.owners("m:latest", False)), ["b"])
        self.assertEqual(snap.owners("n:latest", False), ())
        self.assertEqual(ids(snap.owners("n:latest", True)), ["s"])


class OrderCandidatesTests(SynchronousTestCase):
    """``orderCandidates`` applies pin, scheduler rank, then default order."""

    owners = (node("s", isSelf=True), node("a"), node("b"), node("c"), node("d"))

    def test_defaultOnly(self) -> None:
        """With no pin and no rank the default order stands."""
        ordered, pinned = orderCandidates(self.owners, None, {})
        self.assertEqual(ids(ordered), ["s", "a", "b", "c", "d"])
        self.assertFalse(pinned)

    def test_eligiblePin(self) -> None:
        """An eligible pin goes first and is reported applied."""
        ordered, pinned = orderCandidates(self.owners, "c", {"b": 0, "a": 1})
        self.assertEqual(ids(ordered), ["c", "b", "a", "s", "d"])
        self.assertTrue(pinned)

    def test_ineligiblePin(self) -> None:
        """An ineligible pin changes nothing and adds nobody."""
        ordered, pinned = orderCandidates(self.owners, "x", {"b": 0})
        self.assertEqual(ids(ordered), ["b", "s", "a", "c", "d"])
        self.assertFalse(pinned)

    def test_rank(self) -> None:
        """Listed owners follow the scheduler order; unlisted ones follow in default order."""
        rank = {"d": 0, "x": 1, "b": 2, "a": 3}
        ordered, _ = orderCandidates(self.owners, None, rank)
        self.assertEqual(ids(ordered), ["d", "b", "a", "s", "c"])

    def test_cachedPerRank(self) -> None:
        """A snapshot's owner tuple reorders correctly when the rank mapping changes."""
        snap = Snapshot([node("a", "m"), node("b", "m"), node("c", "m")], ollama)
        owners = snap.owners("m:latest", True)
        m = ReservationMap()
        self.assertEqual(ids(orderCandidates(owners, None, m.rank)[0]), ["a", "b", "c"])
        m.applyPriority(1, ["c", "b"], {})
        self.assertEqual(ids(orderCandidates(owners, None, m.rank)[0]), ["c", "b", "a"])
        self.assertEqual(ids(orderCandidates(owners, None, m.rank)[0]), ["c", "b", "a"])
        self.assertEqual(ids(orderCandidates(owners, "a", m.rank)[0]), ["a", "c", "b"])
        m.applyPriority(2, ["a", "c"], {})
        self.assertEqual(ids(orderCandidates(owners, None, m.rank)[0]), ["a", "c", "b"])
        self.assertEqual(ids(orderCandidates(owners, None, {})[0]), ["a", "b", "c"])

    def test_freshOrder(self) -> None:
        """Each call returns a new order; moving a candidate in one changes no other."""
        snap = Snapshot([node("a", "m"), node("b", "m"), node("c", "m")], ollama)
        owners = snap.owners("m:latest", True)
        first, _ = orderCandidates(owners, None, {})
        first.moveToFront(2)
        first.moveToFront(2)
        self.assertEqual(ids(first), ["b", "c", "a"])
        self.assertEqual(ids(orderCandidates(owners, None, {})[0]), ["a", "b", "c"])
        self.assertEqual(ids(owners), ["a", "b", "c"])

    def test_orderIsASequence(self) -> None:
        """A moved order answers length, indexes, negative indexes and slices as a list."""
        owners = tuple(node(i) for i in "abcde")
        ordered, _ = orderCandidates(owners, "d", {})
        expected = [node(i) for i in "dabce"]
        self.assertEqual(len(ordered), 5)
        self.assertEqual([ordered[i] for i in range(5)], expected)
        self.assertEqual([ordered[i] for i in range(-5, 0)], expected)
        self.assertEqual(ordered[1:3], expected[1:3])
        self.assertRaises(IndexError, lambda: ordered[5])
        self.assertRaises(IndexError, lambda: ordered[-6])


class PlaceReservationTests(SynchronousTestCase):
    """``placeReservation`` picks the least-loaded scheduler-listed candidate."""

    def test_pinned(self) -> None:
        """With an applied pin there is no reservation and the order is untouched."""
        m = ReservationMap()
        m.reserve("a")
        ordered, pinned = orderCandidates((node("a"), node("b")), "a", {})
        self.assertIsNone(placeReservation(ordered, pinned, m))
        self.assertEqual(ids(ordered), ["a", "b"])

    def test_standalone(self) -> None:
        """Before any snapshot every candidate is listed and only reservations count."""
        m = ReservationMap()
        ordered, pinned = orderCandidates((node("a"), node("b"), node("c")), None, m.rank)
        self.assertEqual(placeReservation(ordered, pinned, m), node("a"))
        self.assertEqual(ids(ordered), ["a", "b", "c"])
        m.reserve("a")
        ordered, pinned = orderCandidates((node("a"), node("b"), node("c")), None, m.rank)
        chosen = placeReservation(ordered, pinned, m)
        self.assertEqual(chosen, node("b"))
        self.assertEqual(ids(ordered), ["b", "a", "c"])

    def test_leastLoaded(self) -> None:
        """Load is pending + gpuPressure + reservations; the least loaded moves to the front."""
        m = ReservationMap()
        m.applyPriority(
            1,
            ["a", "b", "c"],
            {"a": NodeLoad(1, 0.5), "b": NodeLoad(1, 0.25), "c": NodeLoad(0, 1.75)},
        )
        owners = (node("a"), node("b"), node("c"))
        ordered, pinned = orderCandidates(owners, None, m.rank)
        self.assertEqual(placeReservation(ordered, pinned, m), node("b"))
        self.assertEqual(ids(ordered), ["b", "a", "c"])
        m.reserve("b")  # b: 2.25, a: 1.5, c: 1.75
        ordered, pinned = orderCandidates(owners, None, m.rank)
        self.assertEqual(placeReservation(ordered, pinned, m), node("a"))
        self.assertEqual(ids(ordered), ["a", "b", "c"])
        m.reserve("a")  # a: 2.5 -> c: 1.75 least
        ordered, pinned = orderCandidates(owners, None, m.rank)
        self.assertEqual(placeReservation(ordered, pinned, m), node("c"))
        self.assertEqual(ids(ordered), ["c", "a", "b"])

    def test_tiesKeepOrder(self) -> None:
        """Among equally loaded candidates the earliest in the order wins."""
        m = ReservationMap()
        m.applyPriority(1, ["c", "b", "a"], {"a": NodeLoad(1, 0.0), "b": NodeLoad(1, 0.0)})
        m.reserve("c")
        m.reserve("c")
        ordered, pinned = orderCandidates((node("a"), node("b"), node("c")), None, m.rank)
        self.assertEqual(ids(ordered), ["c", "b", "a"])
        self.assertEqual(placeReservation(ordered, pinned, m), node("b"))
        self.assertEqual(ids(ordered), ["b", "c", "a"])

    def test_tieAcrossSchedulerLoad(self) -> None:
        """A reserved node with less scheduler load ties with, and loses to, an earlier node."""
        m = ReservationMap()
        m.applyPriority(1, ["y", "z", "x"], {"y": NodeLoad(1, 0.0), "z": NodeLoad(1, 0.0)})
        m.reserve("x")  # x: 0 + 1 = 1, y: 1, z: 1 -> y is first in order
        snap = Snapshot([node("x", "m"), node("y", "m"), node("z", "m")], ollama)
        ordered, pinned = orderCandidates(snap.owners("m:latest", True), None, m.rank)
        self.assertEqual(ids(ordered), ["y", "z", "x"])
        self.assertEqual(placeReservation(ordered, pinned, m), snap.get("y"))
        self.assertEqual(ids(ordered), ["y", "z", "x"])
        m.reserve("y")  # y: 2, z: 1, x: 1 -> z is earlier than x
        ordered, pinned = orderCandidates(snap.owners("m:latest", True), None, m.rank)
        self.assertEqual(placeReservation(ordered, pinned, m), snap.get("z"))
        self.assertEqual(ids(ordered), ["z", "y", "x"])

    def test_foreignRankMapping(self) -> None:
        """A rank mapping other than the map's own still yields the least-loaded candidate."""
        m = ReservationMap()
        m.applyPriority(1, ["a", "b", "c"], {"b": NodeLoad(1, 0.0)})
        m.reserve("a")  # a: 1, b: 1, c: 0
        snap = Snapshot([node("a", "m"), node("b", "m"), node("c", "m")], ollama)
        ordered, pinned = orderCandidates(snap.owners("m:latest", True), None, dict(m.rank))
        self.assertEqual(placeReservation(ordered, pinned, m), snap.get("c"))
        self.assertEqual(ids(ordered), ["c", "a", "b"])

    def test_unlistedNotChosen(self) -> None:
        """Unlisted candidates are never reserved; no listed candidate means None."""
        m = ReservationMap()
        m.applyPriority(1, ["b"], {"b": NodeLoad(50, 0.0)})
        ordered, pinned = orderCandidates((node("a"), node("b")), None, m.rank)
        self.assertEqual(ids(ordered), ["b", "a"])
        self.assertEqual(placeReservation(ordered, pinned, m), node("b"))
        ordered, pinned = orderCandidates((node("a"), node("c")), None, m.rank)
        self.assertIsNone(placeReservation(ordered, pinned, m))
        self.assertEqual(ids(ordered), ["a", "c"])

    def test_ineligiblePinStillReserves(self) -> None:
        """An ineligible pin does not suppress the reservation."""
        m = ReservationMap()
        m.reserve("a")
        ordered, pinned = orderCandidates((node("a"), node("b")), "zzz", m.rank)
        self.assertFalse(pinned)
        self.assertEqual(placeReservation(ordered, pinned, m), node("b"))

    def test_empty(self) -> None:
        """No candidates means no reservation."""
        self.assertIsNone(placeReservation([], False, ReservationMap()))

    def test_modifiedListScannedAsGiven(self) -> None:
        """A plain candidate list is judged by its contents and reordered in place."""
        snap = Snapshot([node("a", "m"), node("b", "m"), node("c", "m")], ollama)
        m = ReservationMap()
        m.reserve("a")
        ordered, pinned = orderCandidates(snap.owners("m:latest", True), None, m.rank)
        reversed_ = list(reversed(ordered))
        self.assertEqual(placeReservation(reversed_, pinned, m), snap.get("c"))
        self.assertEqual(ids(reversed_), ["c", "b", "a"])
        ordered, pinned = orderCandidates(snap.owners("m:latest", True), None, m.rank)
        changed = list(ordered)
        changed[1] = node("z")
        self.assertEqual(placeReservation(changed, pinned, m), node("z"))
        self.assertEqual(ids(changed), ["z", "a", "c"])


def _naiveOrder(
    owners: Sequence[Node], pin: str | None, rank: Mapping[str, int]
) -> tuple[list[Node], bool]:
    """A direct transcription of the ordering rule."""
    ownerIds = [n.id for n in owners]
    pinApplied = pin is not None and pin in ownerIds
    first = [n for n in owners if pinApplied and n.id == pin]
    rest = [n for n in owners if not (pinApplied and n.id == pin)]
    listed = sorted((n for n in rest if n.id in rank), key=lambda n: rank[n.id])
    unlisted = [n for n in rest if n.id not in rank]
    return first + listed + unlisted, pinApplied


def _naivePlace(ordered: list[Node], pinApplied: bool, m: ReservationMap) -> Node | None:
    """A direct transcription of the placement rule."""
    if pinApplied:
        return None
    listed = [(m.estimatedLoad(n.id), i) for i, n in enumerate(ordered) if m.isListed(n.id)]
    if not listed:
        return None
    _, index = min(listed)
    chosen = ordered.pop(index)
    ordered.insert(0, chosen)
    return chosen


_IDS = ["a", "b", "c", "d", "e", "f"]


@st.composite
def _scenarios(draw: st.DrawFn) -> tuple[Snapshot, list[tuple[object, ...]]]:
    nodes = [
        Node(i, draw(st.booleans()), (), frozenset(draw(st.sets(st.sampled_from(["m", "n"])))))
        for i in draw(st.lists(st.sampled_from(_IDS), unique=True, max_size=6))
    ]
    ops: list[tuple[object, ...]] = draw(
        st.lists(
            st.one_of(
                st.tuples(
                    st.just("route"),
                    st.sampled_from(["m", "n"]),
                    st.booleans(),
                    st.none() | st.sampled_from(_IDS),
                    st.booleans(),
                ),
                st.tuples(
                    st.just("apply"),
                    st.lists(st.sampled_from(_IDS), max_size=6),
                    st.dictionaries(
                        st.sampled_from(_IDS),
                        st.builds(NodeLoad, st.integers(0, 3), st.sampled_from([0.0, 0.5, 1.0])),
                    ),
                ),
                st.tuples(st.just("reserve"), st.sampled_from(_IDS)),
            ),
            max_size=25,
        )
    )
    return Snapshot(nodes, ollama), ops


class RoutingPropertyTests(SynchronousTestCase):
    """The indexed, cached routing agrees with a direct transcription of the rules."""

    @settings(max_examples=600, deadline=None)
    @given(_scenarios())
    def test_matchesNaive(self, scenario: tuple[Snapshot, list[tuple[object, ...]]]) -> None:
        """Owners, order, pin flag and the placed node equal the naive computation."""
        snap, ops = scenario
        m = ReservationMap()
        generation = 0
        for op in ops:
            if op[0] == "apply":
                generation += 1
                order, load = op[1], op[2]
                assert isinstance(order, list) and isinstance(load, dict)
                m.applyPriority(generation, order, load)
            elif op[0] == "reserve":
                m.reserve(str(op[1]))
            else:
                model, local, pin, copyRank = op[1], op[2], op[3], op[4]
                assert isinstance(model, str) and isinstance(local, bool)
                # A copied rank mapping takes the per-owner sort instead of the fleet order.
                rank = dict(m.rank) if copyRank else m.rank
                assert pin is None or isinstance(pin, str)
                owners = snap.owners(ollama(model), local)
                expectedOwners = [
                    n for n in snap.nodes if model in n.models and (local or not n.isSelf)
                ]
                self.assertEqual(list(owners), expectedOwners)
                ordered, pinned = orderCandidates(owners, pin, rank)
                naive, naivePinned = _naiveOrder(list(owners), pin, rank)
                self.assertEqual((list(ordered), pinned), (naive, naivePinned))
                chosen = placeReservation(ordered, pinned, m)
                self.assertEqual(chosen, _naivePlace(naive, naivePinned, m))
                self.assertEqual(list(ordered), naive)
                if chosen is not None:
                    m.reserve(chosen.id)
