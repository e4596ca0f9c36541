"""Unit tests for nvpair.proxy.facade.standalone: static fleets and inventory polling on a Clock."""

from __future__ import annotations

from twisted.internet.error import ConnectionRefusedError
from twisted.logger import Logger
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nvpair.proxy.engines import LLAMACPP, LMSTUDIO, OLLAMA
from nvpair.proxy.facade.standalone import (
    POLL_INTERVAL,
    BackendState,
    FleetPoller,
    IStandaloneProcess,
    fleetUrls,
    startStandalone,
)
from nvpair.proxy.testing.fakecontext import FakeContext
from tests.facade.fleetkit import FakeResponse, FakeUpstream, openaiList, started
from tests.support.fakes.logevents import Events
from tests.support.fakes.standalone import TIMEOUT, FakeService, RecordingFacade


class FleetUrlsTests(SynchronousTestCase):
    """Which nodes make a standalone fleet."""

    def test_backendsInOrder(self) -> None:
        """The engine's ``--backend`` URLs in the order given, other engines' ignored,
        repeats dropped."""
        backends = (
            ("llamacpp", "http://b:1"),
            ("ollama", "http://o:1"),
            ("llamacpp", "http://a:1/"),
            ("llamacpp", "http://b:1"),
        )
        self.assertEqual(fleetUrls(LLAMACPP, backends), ["http://b:1", "http://a:1"])

    def test_defaults(self) -> None:
        """An engine without ``--backend`` gets one node at its default address (protocol §9)."""
        self.assertEqual(fleetUrls(OLLAMA, ()), ["http://127.0.0.1:11434"])
        self.assertEqual(fleetUrls(LMSTUDIO, ()), ["http://127.0.0.1:1235"])
        self.assertEqual(
            fleetUrls(LLAMACPP, (("ollama", "http://x:1"),)), ["http://127.0.0.1:8081"]
        )


class FleetPollerTests(SynchronousTestCase):
    """Polling inventories into the facade's snapshot."""

    def setUp(self) -> None:
        self.context = FakeContext(upstream=FakeUpstream())
        self.up = self.context.upstream
        self.clock = self.context.clock
        self.facade = RecordingFacade()

    def poller(self, *urls: str) -> FleetPoller:
        return started(self, FleetPoller(self.facade, urls, self.up, self.clock, TIMEOUT))

    def test_startPublishesThenPolls(self) -> None:
        """At start the fleet is published with empty inventories, then each engine is asked
        for its inventory route at once; nodes are direct, keyed by URL."""
        self.up.script["http://a"] = FakeResponse(200, openaiList("a", "m1", "m2"))
        self.up.script["http://b"] = "hang"
        self.poller("http://a", "http://b")
        first = self.facade.snapshots[0]
        self.assertEqual(
            [(n.id, n.isSelf, n.addresses, n.models) for n in first.nodes],
            [
                ("http://a", False, ("http://a",), frozenset()),
                ("http://b", False, ("http://b",), frozenset()),
            ],
        )
        self.assertEqual(self.facade.inventories(), {"http://a": ["m1", "m2"], "http://b": []})
        self.assertEqual(
            [(c[1], c[2], c[3]) for c in self.up.calls],
            [("http://a", b"GET", b"/v1/models"), ("http://b", b"GET", b"/v1/models")],
        )
        last = self.facade.snapshots[-1]
        self.assertEqual([n.id for n in last.owners("m1", False)], ["http://a"])

    def test_ollamaInventoryNormalized(self) -> None:
        """Ollama's inventory comes from /api/tags, and its snapshot applies ``:latest``."""
        self.facade = RecordingFacade(OLLAMA)
        self.up.script["http://o"] = FakeResponse(200, b'{"models":[{"name":"llama3:latest"}]}')
        self.poller("http://o")
        self.assertEqual(self.up.calls[0][3], b"/api/tags")
        self.assertEqual(len(self.facade.snapshots[-1].owners("llama3:latest", False)), 1)

    def test_pollsEveryInterval(self) -> None:
        """Every five seconds each engine is asked again and changes are published."""
        self.up.script["http://a"] = FakeResponse(200, openaiList("a", "m1"))
        self.poller("http://a")
        self.assertEqual(len(self.up.calls), 1)
        self.clock.advance(POLL_INTERVAL - 0.01)
        self.assertEqual(len(self.up.calls), 1)
        self.up.script["http://a"] = FakeResponse(200, openaiList("a", "m1", "m3"))
        self.clock.advance(0.01)
        self.assertEqual(len(self.up.calls), 2)
        self.assertEqual(self.facade.inventories(), {"http://a": ["m1", "m3"]})
        self.assertEqual(POLL_INTERVAL, 5.0)

    def test_unchangedNotRepublished(self) -> None:
        """An unchanged inventory does not replace the snapshot (caches stay warm)."""
        self.up.script["http://a"] = FakeResponse(200, openaiList("a", "m1"))
        self.poller("http://a")
        count = len(self.facade.snapshots)
        for _ in range(3):
            self.clock.advance(POLL_INTERVAL)
        self.assertEqual(len(self.up.calls), 4)
        self.assertEqual(len(self.facade.snapshots), count)

    def test_downThenUp(self) -> None:
        """An engine that fails, answers non-2xx or an invalid list has an empty inventory
        until it answers again; each change of state is logged once."""
        events = Events()
        self.patch(FleetPoller, "log", Logger(observer=events))
        self.up.script["http://a"] = "hang"
        poller = self.poller("http://a")
        self.assertIs(poller.up["http://a"], BackendState.UNKNOWN)
        self.up.script["http://a"] = FakeResponse(200, openaiList("a", "m1"))
        self.clock.advance(TIMEOUT)
        self.assertIs(poller.up["http://a"], BackendState.DOWN)
        self.clock.advance(POLL_INTERVAL)
        self.assertEqual(self.facade.inventories(), {"http://a": ["m1"]})
        self.assertIs(poller.up["http://a"], BackendState.UP)
        for failure in (
            ConnectionRefusedError(),
            FakeResponse(500, b"x"),
            FakeResponse(200, b"not a list"),
        ):
            self.up.script["http://a"] = FakeResponse(200, openaiList("a", "m1"))
            self.clock.advance(POLL_INTERVAL)
            self.assertEqual(self.facade.inventories(), {"http://a": ["m1"]})
            self.up.script["http://a"] = failure
            self.clock.advance(POLL_INTERVAL)
            self.assertEqual(self.facade.inventories(), {"http://a": []})
            self.assertIs(poller.up["http://a"], BackendState.DOWN)
        logged = [e["log_format"] for e in events]
        self.assertEqual(logged, ["backend-down", "backend-up"] * 3 + ["backend-down"])

    def test_hungEngineTimesOut(self) -> None:
        """A silent engine is given up on after the timeout and counted down; polling goes on."""
        self.up.script["http://a"] = "hang"
        self.poller("http://a")
        self.clock.advance(TIMEOUT)
        self.assertEqual(self.up.cancelled, ["http://a"])
        self.up.script["http://a"] = FakeResponse(200, openaiList("a", "m1"))
        self.clock.advance(POLL_INTERVAL)
        self.assertEqual(self.facade.inventories(), {"http://a": ["m1"]})

    def test_stopEndsPolling(self) -> None:
        """Stopping cancels polls in flight and leaves no timer behind."""
        self.up.script["http://a"] = "hang"
        poller = self.poller("http://a")
        published = len(self.facade.snapshots)
        poller.stopService()
        self.assertEqual(self.up.cancelled, ["http://a"])
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(POLL_INTERVAL * 3)
        self.assertEqual(len(self.up.calls), 1)
        self.assertEqual(len(self.facade.snapshots), published)


class StartStandaloneTests(SynchronousTestCase):
    """``startStandalone`` wires each facade to its poller, as a child of the process."""

    def test_fakeProcess(self) -> None:
        """The fake process provides what standalone mode uses."""
        self.assertTrue(verifyObject(IStandaloneProcess, FakeService(("ollama",), ())))

    def test_facadesAndPollers(self) -> None:
        """Each named engine is enabled on its standalone port with a poller over its fleet;
        a facade that cannot bind gets none; stopping the process stops the pollers."""
        service = FakeService(
            ("ollama", "llamacpp", "lmstudio"),
            (("llamacpp", "http://x:1"), ("llamacpp", "http://y:2")),
            refuse=frozenset({"lmstudio"}),
        )
        service.startService()
        startStandalone(service)
        self.assertEqual(service.enabled, [("ollama", 11435), ("llamacpp", 8080)])
        pollers = {p.engine.id: p for p in service if isinstance(p, FleetPoller)}
        self.assertEqual(
            {k: p.urls for k, p in pollers.items()},
            {"ollama": ("http://127.0.0.1:11434",), "llamacpp": ("http://x:1", "http://y:2")},
        )
        self.assertEqual(pollers["llamacpp"].timeout, 11.0)
        self.assertTrue(all(p.running for p in pollers.values()))
        self.assertEqual(
            service.facades["llamacpp"].inventories(), {"http://x:1": [], "http://y:2": []}
        )
        # The backends' order stands in for a scheduler's priority list.
        self.assertEqual(
            service.context.reservations.order,
            ("http://127.0.0.1:11434", "http://x:1", "http://y:2"),
        )
        service.stopService()
        self.assertFalse(any(p.running for p in pollers.values()))
        self.assertEqual(service.context.clock.getDelayedCalls(), [])
