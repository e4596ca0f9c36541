"""Unit tests of the pollers following a reloaded fleet (``FleetPoller.setBackends``) and
of standalone mode started with a fleet file."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nvpair.proxy.facade.fleetfile import Backend
from nvpair.proxy.facade.reload import (
    IFleetFollower,
    findReloader,
)
from nvpair.proxy.facade.standalone import (
    DRAIN_CHECK,
    POLL_INTERVAL,
    FleetPoller,
    startStandalone,
)
from nvpair.proxy.testing.fakecontext import FakeContext
from tests.facade.fleetkit import FakeResponse, FakeUpstream, openaiList
from tests.fleetconf.filekit import ONE, TWO, FleetFile
from tests.support.fakes.standalone import TIMEOUT, FakeService, RecordingFacade


class DrainTests(SynchronousTestCase):
    """A poller following a reloaded fleet (``FleetPoller.setBackends``)."""

    def setUp(self) -> None:
        self.context = FakeContext(upstream=FakeUpstream())
        self.up = self.context.upstream
        self.clock = self.context.clock
        self.facade = RecordingFacade()
        self.busy: dict[str, int] = {}

    def poller(self, *urls: str) -> FleetPoller:
        poller = FleetPoller(
            self.facade,
            urls,
            self.up,
            self.clock,
            TIMEOUT,
            inFlight=lambda url: self.busy.get(url, 0),
        )
        poller.startService()
        self.addCleanup(poller.stopService)
        return poller

    def test_follower(self) -> None:
        """The poller provides ``IFleetFollower``."""
        verifyObject(IFleetFollower, self.poller("http://a"))

    def test_addedPolledAtOnce(self) -> None:
        """A new backend is asked for its models at once and takes traffic on its answer;
        a kept one keeps its inventory without being asked again."""
        self.up.script["http://a"] = FakeResponse(200, openaiList("a", "m1"))
        self.up.script["http://b"] = FakeResponse(200, openaiList("b", "m1"))
        poller = self.poller("http://a")
        calls = len(self.up.calls)
        poller.setBackends(
            [Backend("llamacpp", "http://a"), Backend("llamacpp", "http://b", "B", 3)]
        )
        self.assertEqual([c[1] for c in self.up.calls[calls:]], ["http://b"])
        self.assertEqual(self.facade.inventories(), {"http://a": ["m1"], "http://b": ["m1"]})
        self.assertEqual(poller.backends[1].maxConcurrency, 3)
        self.assertEqual(poller.backends[1].name, "B")

    def test_removedIdleLeaves(self) -> None:
        """A removed backend with nothing in flight leaves at once and is polled no more."""
        self.up.script["http://a"] = FakeResponse(200, openaiList("a", "m1"))
        self.up.script["http://b"] = "hang"
        poller = self.poller("http://a", "http://b")
        poller.setBackends([Backend("llamacpp", "http://a")])
        self.assertEqual(self.up.cancelled, ["http://b"])  # its hung poll abandoned
        self.assertEqual(self.facade.inventories(), {"http://a": ["m1"]})
        calls = len(self.up.calls)
        self.clock.advance(POLL_INTERVAL * 2)
        self.assertEqual({c[1] for c in self.up.calls[calls:]}, {"http://a"})
        self.assertNotIn("http://b", poller.up)

    def test_removedBusyDrains(self) -> None:
        """A removed backend with work in flight stays listed owning nothing (no new
        request, its pending attempts not abandoned) until its work is done."""
        self.up.script["http://a"] = FakeResponse(200, openaiList("a", "m1"))
        self.up.script["http://b"] = FakeResponse(200, openaiList("b", "m1"))
        poller = self.poller("http://a", "http://b")
        self.busy["http://b"] = 2
        poller.setBackends([Backend("llamacpp", "http://a")])
        self.assertEqual(self.facade.inventories(), {"http://a": ["m1"], "http://b": []})
        self.assertEqual(
            [n.id for n in self.facade.snapshots[-1].owners("m1", False)], ["http://a"]
        )
        self.assertEqual(list(poller.draining), ["http://b"])
        self.clock.advance(DRAIN_CHECK * 3)
        self.assertIn("http://b", self.facade.inventories())
        self.busy["http://b"] = 0
        self.clock.advance(DRAIN_CHECK)
        self.assertEqual(self.facade.inventories(), {"http://a": ["m1"]})
        self.assertEqual(poller.draining, {})
        self.assertEqual(  # only the poll loop is left: no drain timer
            len(self.clock.getDelayedCalls()), 1
        )

    def test_readdedWhileDraining(self) -> None:
        """A draining backend listed again is a backend again, polled at once."""
        self.up.script["http://a"] = FakeResponse(200, openaiList("a", "m1"))
        poller = self.poller("http://a")
        self.busy["http://a"] = 1
        poller.setBackends([])
        self.assertEqual(list(poller.draining), ["http://a"])
        poller.setBackends([Backend("llamacpp", "http://a")])
        self.assertEqual(poller.draining, {})
        self.assertEqual(self.facade.inventories(), {"http://a": ["m1"]})

    def test_lateAnswerOfRemoved(self) -> None:
        """A poll answering after its backend was removed changes nothing."""
        self.up.script["http://a"] = FakeResponse(200, openaiList("a", "m1"))
        poller = self.poller("http://a")
        poller.setBackends([])
        poller.poll("http://a")
        self.assertEqual(self.facade.inventories(), {})


class StandaloneFleetFileTests(SynchronousTestCase):
    """``startStandalone`` with ``--fleet``: the process's facades follow the file."""

    def test_fleetFile(self) -> None:
        """Facades and pollers come from the file; a reload reaches the poller and keeps
        the live reservations while the order changes."""
        file = FleetFile(self, ONE)
        process = FakeService(("llamacpp",), (), fleetFile=file.path, affinity="prefix")
        startStandalone(process)
        process.startService()
        self.addCleanup(process.stopService)
        reloader = findReloader(process)
        assert reloader is not None
        poller = process.getServiceNamed("standalone-llamacpp")
        assert isinstance(poller, FleetPoller)
        self.assertEqual(poller.backends, (Backend("llamacpp", "http://a:1", "alpha"),))
        reservations = process.reservations
        self.assertEqual(reservations.order, ("http://a:1",))
        held = reservations.reserve("http://a:1")
        affinity = process.context.affinity
        assert affinity is not None
        affinity.table.record(1234, "http://a:1")  # a conversation at home on A
        file.write(TWO)
        reloader.reload("signal")
        self.assertEqual(poller.urls, ("http://a:1", "http://b:1"))
        self.assertEqual(poller.backends[1].maxConcurrency, 2)
        self.assertEqual(reservations.order, ("http://a:1", "http://b:1"))
        self.assertEqual(reservations.estimatedLoad("http://a:1"), 1)
        held.release()
        self.assertEqual(reservations.estimatedLoad("http://a:1"), 0)
        self.assertIs(process.context.affinity, affinity)
        self.assertEqual(affinity.table.lookup([1234]), "http://a:1")  # still at home
        self.assertEqual(
            process.metrics.registry.get_sample_value(
                "nvpair_proxy_fleet_reloads_total", {"result": "applied"}
            ),
            1.0,
        )
