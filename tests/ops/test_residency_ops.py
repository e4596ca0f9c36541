"""Which models each node holds on ``/status``, ``/metrics`` and the page (standalone)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.probes import EngineReport, ResidentModel
from nvpair.proxy.nodestate.residency import Residency
from nvpair.proxy.nodestate.states import EngineStates
from nvpair.proxy.ops.gauges import StateCollector
from nvpair.proxy.ops.history import Window
from nvpair.proxy.ops.page import renderPage
from nvpair.proxy.ops.residencyview import METRIC_MODELS
from nvpair.proxy.ops.server import historyDocument, statusDocument
from tests.ops.opskit import makeService, scripted
from tests.support.dom import parseDom


def held(*models: str, loading: str = "") -> EngineReport:
    """A probe that lists these models loaded (and one loading)."""
    resident = [ResidentModel(m) for m in models]
    if loading:
        resident.append(ResidentModel(loading, state="loading"))
    return EngineReport(loaded=frozenset(models), resident=tuple(resident), router=True)


class ResidencyOpsTests(SynchronousTestCase):
    """The residency view, shown."""

    def setUp(self) -> None:
        self.clock = MemoryReactorClock()
        self.service = makeService(self.clock)
        scripted(self.service)
        context = self.service.context
        ledger = RoomLedger(context.clock, context.activity.inFlight)
        self.states = EngineStates(context.clock, ledger)
        residency = self.residency = Residency(context.clock, self.states, ledger)
        self.states.residency = residency
        for report in (held("a", "b"), held("a", loading="c"), held("a", "c")):
            self.clock.advance(1)
            self.states.record("A", report, 1.0, "/models (router)")
            residency.observe("A", report)

    def test_absentWithoutIt(self) -> None:
        """Under a broker (no engine states) /status has no residency."""
        self.assertNotIn("residency", statusDocument(self.service))

    def test_statusAndPage(self) -> None:
        """Per node: the models held with their state, loads and evictions seen, what it
        can hold; the page says it in one line."""
        self.service.context.engineStates = self.states
        status = statusDocument(self.service)
        node = status["residency"]["nodes"]["A"]  # type: ignore[index]
        self.assertEqual(
            [(m["model"], m["state"]) for m in node["models"]], [("a", "loaded"), ("c", "loaded")]
        )
        self.assertEqual((node["loads"], node["evictions"], node["capacity"]), (1, 1, 2))
        self.assertIsNone(status["residency"]["actions"])
        html = renderPage(status, historyDocument(self.service), Window().document(0))
        (line,) = parseDom(html).all("div", class_="resident")
        self.assertEqual(line.textContent(), "holds a, c · 1 load · 1 eviction")

    def test_metrics(self) -> None:
        """Loads and evictions per node, each model held (1 loaded, 0 loading), capacity;
        at most ``METRIC_MODELS`` models per node."""
        self.service.context.engineStates = self.states
        registry = CollectorRegistry()
        registry.register(StateCollector(self.service))
        text = generate_latest(registry).decode()
        for line in (
            'nvpair_proxy_model_loads_total{node="A"} 1.0',
            'nvpair_proxy_model_evictions_total{node="A"} 1.0',
            'nvpair_proxy_model_loaded{model="a",node="A"} 1.0',
            'nvpair_proxy_node_model_capacity{node="A"} 2.0',
        ):
            self.assertIn(line, text)
        self.clock.advance(1)
        many = [f"m{i}" for i in range(METRIC_MODELS + 10)]
        report = held(*many[1:], loading=many[0])
        self.states.record("A", report, 1.0, "/models (router)")
        self.residency.observe("A", report)
        text = generate_latest(registry).decode()
        self.assertEqual(text.count("nvpair_proxy_model_loaded{"), METRIC_MODELS)
        self.assertIn('nvpair_proxy_model_loaded{model="m0",node="A"} 0.0', text)
