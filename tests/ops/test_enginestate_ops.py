"""The engines' own state on ``/status``, ``/metrics`` and the page (standalone)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.probes import EngineReport
from nvpair.proxy.nodestate.states import EngineStates
from nvpair.proxy.ops.gauges import StateCollector
from nvpair.proxy.ops.history import Window
from nvpair.proxy.ops.page import engineLine, renderPage
from nvpair.proxy.ops.server import historyDocument, statusDocument
from nvpair.proxy.placement.affinity import Affinity
from tests.ops.opskit import makeService, scripted
from tests.support.dom import parseDom


class EngineStateOpsTests(SynchronousTestCase):
    """What the poller read is shown per node; nothing of it under a broker."""

    def setUp(self) -> None:
        self.clock = MemoryReactorClock()
        self.service = makeService(self.clock)
        scripted(self.service)
        context = self.service.context
        self.ledger = RoomLedger(context.clock, context.activity.inFlight)
        self.states = EngineStates(context.clock, self.ledger)
        self.states.record(
            "A", EngineReport(busy=1, total=4, loaded=frozenset({"m1"})), 1.0, "/slots"
        )
        self.ledger.probed("A", 1, 4, 1.0)
        self.states.served("A", 1000, 800)

    def test_absentUnderBroker(self) -> None:
        """Without engine states (a broker ranks), /status has none and nodes no engine."""
        status = statusDocument(self.service)
        self.assertNotIn("engineStates", status)
        for node in status["facades"]["llamacpp"]["nodes"]:
            self.assertNotIn("engine", node)

    def test_statusAndPage(self) -> None:
        """Per node: slots busy/total, loaded models, age, fresh/unknown, cache hit ratio;
        the page says the same in words, and unknown once the probe is stale."""
        self.service.context.engineStates = self.states
        status = statusDocument(self.service)
        (engine,) = [n["engine"] for n in status["facades"]["llamacpp"]["nodes"] if "engine" in n]
        self.assertEqual(
            {k: engine[k] for k in ("state", "slotsBusy", "slotsTotal", "loaded", "cacheHitRatio")},
            {
                "state": "fresh",
                "slotsBusy": 1,
                "slotsTotal": 4,
                "loaded": ["m1"],
                "cacheHitRatio": 0.8,
            },
        )
        self.assertEqual(status["engineStates"]["A"], engine)
        html = renderPage(status, historyDocument(self.service), Window().document(0))
        (line,) = parseDom(html).all("div", class_="engine")
        self.assertEqual(line.textContent(), "slots 1/4 busy · 1 loaded · cache 80%")
        self.clock.advance(3)
        stale = statusDocument(self.service)["engineStates"]["A"]
        self.assertEqual(stale["state"], "unknown")
        self.assertEqual(engineLine(stale), "engine state unknown · cache 80%")

    def test_metrics(self) -> None:
        """Gauges per node, and the prefix index's size."""
        context = self.service.context
        context.engineStates = self.states
        context.affinity = Affinity(context.clock, context.reservations, self.ledger, self.states)
        registry = CollectorRegistry()
        registry.register(StateCollector(self.service))
        text = generate_latest(registry).decode()
        for line in (
            'nvpair_proxy_engine_slots_busy{node="A"} 1.0',
            'nvpair_proxy_engine_slots_total{node="A"} 4.0',
            'nvpair_proxy_engine_slots_available{node="A"} 3.0',
            'nvpair_proxy_engine_state_fresh{node="A"} 1.0',
            'nvpair_proxy_engine_cached_prompt_tokens_total{node="A"} 800.0',
            'nvpair_proxy_engine_cache_hit_ratio{node="A"} 0.8',
            "nvpair_proxy_prefix_index_blocks 0.0",
        ):
            self.assertIn(line, text)
