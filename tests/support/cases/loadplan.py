"""A load planner over a real residency view and room ledger on a ``Clock``, and the
helpers that set what each node holds and serves (spec §11, "Placement that counts
loads"): the base of ``tests/placement/test_loads.py`` and ``test_spill.py``."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.probes import EngineReport, ResidentModel
from nvpair.proxy.nodestate.residency import Residency
from nvpair.proxy.nodestate.states import EngineStates
from nvpair.proxy.placement.interfaces import Backlog, LoadPlan
from nvpair.proxy.placement.loads import LoadPlanner
from nvpair.proxy.routing.nodes import Node

__all__ = ["A", "B", "C", "NODES", "PlanCase", "ps"]

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

    def use(self, node: str, model: str, count: int) -> None:
        """``count`` of ours for ``model`` on ``node``, each ended."""
        for _ in range(count):
            self.begin(node, model)
            self.residency.ended(node, model)

    def plan(
        self, ahead: int = 0, owners: tuple[Node, ...] = NODES, waited: float = 0.0
    ) -> LoadPlan:
        return self.planner.plan(owners, "m", Backlog(ahead, waited))
