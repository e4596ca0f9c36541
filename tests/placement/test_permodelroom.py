"""Placement by cache on engines whose parallel slots are per model (Ollama, LM Studio):
an owner whose own slots for the model are all ours has no room for it (spec §11
"Placement")."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.engines import ENGINES
from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.probes import EngineReport, ResidentModel
from nvpair.proxy.nodestate.residency import Residency
from nvpair.proxy.nodestate.states import EngineStates
from nvpair.proxy.placement.affinity import Affinity
from nvpair.proxy.placement.choose import Hold
from nvpair.proxy.routing.candidates import Snapshot, orderCandidates
from nvpair.proxy.routing.reservations import ReservationMap
from tests.support.conversations import chatKey, turn
from tests.support.fakeupstream import node


class PerModelRoomTests(SynchronousTestCase):
    """On an engine whose slots are per model and not reported (Ollama, LM Studio), an owner
    whose slots for the requested model are all ours has no room for it, whatever room the
    node has for its other models: a copy of the model with a free slot elsewhere wins."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.ours: dict[str, int] = {}
        ledger = RoomLedger(self.clock, self.ours)
        states = EngineStates(self.clock, ledger)
        self.residency = Residency(self.clock, states, ledger)
        self.reservations = ReservationMap()
        self.reservations.applyPriority(0, ["A", "B"], {})
        self.affinity = Affinity(
            self.clock, self.reservations, ledger, states, residency=self.residency
        )
        report = EngineReport(
            loaded=frozenset({"m1", "x"}),
            resident=(ResidentModel("m1", parallel=2), ResidentModel("x", parallel=2)),
        )
        for nodeId in ("A", "B"):
            states.record(nodeId, report, 1.0, "/api/ps")
            self.residency.observe(nodeId, report)
        self.snapshot = Snapshot([node("A"), node("B")], ENGINES["llamacpp"].normalize)

    def occupy(self, nodeId: str, model: str, count: int) -> None:
        for _ in range(count):
            self.reservations.reserve(nodeId)
            self.ours[nodeId] = self.ours.get(nodeId, 0) + 1
            self.residency.began(nodeId, model)

    def place(self, i: int) -> str:
        owners = self.snapshot.owners("m1", False)
        ordered, _ = orderCandidates(owners, None, self.reservations.rank)
        key = chatKey(turn(1, f"q{i}", ""))
        choice = self.affinity.place(ordered, key, "m1", Hold.NONE, None)
        assert choice is not None
        return choice.node.id

    def test_modelFullCopyPassedOver(self) -> None:
        """A runs two of ours for m1 (its two m1 slots), B one for m1 and one for x: both
        as loaded, but every m1 request goes to B, where m1 has a free slot."""
        self.occupy("A", "m1", 2)
        self.occupy("B", "m1", 1)
        self.occupy("B", "x", 1)
        self.assertEqual({self.place(i) for i in range(20)}, {"B"})

    def test_tiesSpreadWhileBothHaveRoom(self) -> None:
        """With a free m1 slot on both, equal loads spread by the key, as before."""
        self.occupy("A", "m1", 1)
        self.occupy("A", "x", 1)
        self.occupy("B", "m1", 1)
        self.occupy("B", "x", 1)
        self.assertEqual({self.place(i) for i in range(20)}, {"A", "B"})

    def test_everyCopyFull(self) -> None:
        """Every copy's m1 slots taken: the choice stands among them (the queue holds the
        request, or the engine does)."""
        self.occupy("A", "m1", 2)
        self.occupy("B", "m1", 2)
        self.assertEqual({self.place(i) for i in range(20)}, {"A", "B"})
