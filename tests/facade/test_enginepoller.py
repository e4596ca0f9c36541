"""The engine-state poller on a ``Clock``: intervals, back-off, fallback, staleness, logs."""

from __future__ import annotations

import json

import attrs
from twisted.internet import defer
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.logger import Logger
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.engines import LLAMACPP, LMSTUDIO, OLLAMA, Engine
from nvpair.proxy.facade.enginepoller import FAST, PROBE_TIMEOUT, SLOW, EnginePoller
from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.probes import EngineReport
from nvpair.proxy.nodestate.states import EngineStates
from tests.facade.fleetkit import FakeResponse, FakeUpstream, runningPoller
from tests.support.fakes.logevents import Events

# The probes' cadence alone: llama.cpp without the identity probe its first report starts
# (``test_engineidentity`` has that).
UNIDENTIFIED = attrs.evolve(LLAMACPP, identityProbe=None)


def slots(busy: int, total: int = 2) -> FakeResponse:
    """A llama.cpp ``/slots`` answer."""
    doc = [{"id": i, "n_ctx": 1024, "is_processing": i < busy} for i in range(total)]
    return FakeResponse(200, json.dumps(doc).encode())


class PollerTests(SynchronousTestCase):
    """Polling each backend's state into ``EngineStates``."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.up = FakeUpstream()
        self.ours: dict[str, int] = {}
        self.ledger = RoomLedger(self.clock, self.ours)
        self.states = EngineStates(self.clock, self.ledger)
        self.traffic = False
        self.reports: list[tuple[str, EngineReport]] = []
        self.events = Events()
        self.patch(EnginePoller, "log", Logger(observer=self.events))

    def poller(self, *urls: str, engine: Engine = UNIDENTIFIED) -> EnginePoller:
        return runningPoller(
            self,
            engine,
            list(urls),
            self.up,
            self.clock,
            self.states,
            self.ledger,
            lambda: self.traffic,
            lambda n, r: self.reports.append((n, r)),
        )

    def probeTimes(self, seconds: float) -> list[float]:
        """The clock times at which the backends were asked, over ``seconds``."""
        times: list[float] = []
        for _ in range(int(seconds / FAST)):
            before = len(self.up.calls)
            self.clock.advance(FAST)
            times += [self.clock.seconds()] * (len(self.up.calls) - before)
        return times

    def test_busyEverySecondIdleBacksOff(self) -> None:
        """While traffic flows a backend is probed every second; idle, the interval doubles
        up to ``SLOW``; when traffic resumes, probing is fast again at once."""
        self.up.script["http://a/slots"] = slots(1)
        self.traffic = True
        self.poller("http://a")
        self.assertEqual(self.probeTimes(5), [1.0, 2.0, 3.0, 4.0, 5.0])
        self.traffic = False
        # Still busy for ACTIVE_WINDOW (10 s) after the last traffic, then backing off.
        times = self.probeTimes(40)
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        self.assertEqual(gaps[:9], [1.0] * 9)
        self.assertEqual(gaps[-3:], [SLOW] * 3)
        self.assertTrue(all(g <= SLOW for g in gaps))
        self.assertIn(2.0, gaps)
        self.traffic = True
        self.assertEqual(len(self.probeTimes(1)), 1)
        self.assertEqual(self.ledger.free("http://a"), 1)
        self.assertEqual(self.reports[-1], ("http://a", EngineReport(1, 2, 2048)))

    def test_lateTicksStillProbeEverySecond(self) -> None:
        """The reactor runs each tick a little late, by a varying amount: a backend is
        still probed at every tick while traffic flows, so its report never lapses
        (before, a tick earlier than the last one's lateness skipped it: a probe every two
        seconds, the report stale for a moment before each)."""
        self.up.script["http://a/slots"] = slots(1)
        self.traffic = True
        self.poller("http://a")
        asked = len(self.up.calls)
        for late in (0.004, 0.001, 0.006, 0.002, 0.0, 0.005, 0.001, 0.003):
            tick = float(int(self.clock.seconds()) + 1)
            self.clock.advance(tick + late - self.clock.seconds())
            self.assertIsNotNone(self.ledger.free("http://a"), f"fresh at {self.clock.seconds()}")
        self.assertEqual(len(self.up.calls) - asked, 8)

    def test_staleAndFailuresAreUnknown(self) -> None:
        """A failing, hung, malformed or non-2xx probe leaves the state unknown (never
        idle); each problem is logged once, its end once."""
        self.traffic = True
        self.up.script["http://a/slots"] = slots(0)
        self.poller("http://a")
        self.assertEqual(self.ledger.free("http://a"), 2)
        self.up.script["http://a/slots"] = "hang"
        self.clock.advance(2 * FAST)
        self.assertEqual(self.ledger.free("http://a"), 2, "fresh for two intervals")
        self.clock.advance(0.5)
        self.assertIsNone(self.ledger.free("http://a"), "older than two intervals")
        self.clock.advance(PROBE_TIMEOUT)
        self.assertEqual(self.up.cancelled, ["http://a"])
        for bad in (ConnectionRefusedError(), FakeResponse(500), FakeResponse(200, b"[{}]")):
            self.up.script["http://a/slots"] = bad
            for _ in range(3):
                self.clock.advance(FAST)
                self.assertIsNone(self.ledger.free("http://a"))
        self.up.script["http://a/slots"] = slots(2)
        self.clock.advance(FAST)
        self.assertEqual(self.ledger.free("http://a"), 0)
        logged = [e["log_format"] for e in self.events]
        self.assertEqual(logged, ["engine-state-unknown", "engine-state-read"])
        self.assertEqual(self.states.status()["http://a"]["state"], "fresh")

    def test_noSlotsFallsBackToMetrics(self) -> None:
        """A llama.cpp server without ``/slots`` (501) is read through ``/metrics`` from
        then on; without either, it stays unknown."""
        self.up.script["http://a/slots"] = FakeResponse(501, b"{}")
        self.up.script["http://a/metrics"] = FakeResponse(
            200, b"llamacpp:requests_processing 3\nllamacpp:requests_deferred 1\n"
        )
        self.up.script["http://b/slots"] = FakeResponse(404)
        self.up.script["http://b/metrics"] = FakeResponse(501)
        self.traffic = True
        self.poller("http://a", "http://b")
        self.clock.advance(FAST)
        self.assertEqual(self.ledger.free("http://a"), 0)
        self.assertEqual(self.states.fresh("http://a"), EngineReport(busy=3, total=3))
        self.assertIsNone(self.ledger.free("http://b"))
        self.clock.advance(FAST)
        paths = [(c[1], c[3]) for c in self.up.calls[-2:]]
        self.assertEqual(sorted(paths), [("http://a", b"/metrics"), ("http://b", b"/metrics")])

    def test_racedProbeAskedAgain(self) -> None:
        """A probe that one of our requests raced (started while it was in flight) counts
        that request once, and its backend is asked again at the next tick, not when due."""
        self.up.script["http://a/slots"] = slots(0)
        self.poller("http://a")
        self.clock.advance(FAST)  # idle: the next probe is due two seconds later
        pending: defer.Deferred[FakeResponse] = defer.Deferred()
        self.up.script["http://a/slots"] = pending
        self.clock.advance(2 * FAST)
        asked = len(self.up.calls)
        self.ours["http://a"] = 1
        self.ledger.activityChanged("http://a", +1)
        pending.callback(slots(1))  # the engine already counted it
        self.assertEqual(self.ledger.free("http://a"), 1)
        self.assertTrue(self.ledger.unsettled("http://a"))
        self.up.script["http://a/slots"] = slots(1)
        self.clock.advance(FAST)
        self.assertEqual(len(self.up.calls), asked + 1)
        self.assertFalse(self.ledger.unsettled("http://a"))
        self.assertEqual(self.ledger.free("http://a"), 1)

    def test_ollamaLoadedModels(self) -> None:
        """Ollama's ``/api/ps`` says which models are loaded."""
        ps = {"models": [{"name": "x:latest", "model": "x:latest", "expires_at": "soon"}]}
        self.up.script["http://o/api/ps"] = FakeResponse(200, json.dumps(ps).encode())
        self.poller("http://o", engine=OLLAMA)
        self.assertIs(self.states.modelLoaded("http://o", "x:latest"), True)
        self.assertIs(self.states.modelLoaded("http://o", "y:latest"), False)
        self.assertIsNone(self.ledger.free("http://o"))

    def test_routerProbedPerLoadedModel(self) -> None:
        """A llama.cpp router (``/slots`` 400: it wants ``?model=``) is read through its
        ``/models`` statuses and each *loaded* model's ``/slots?model=...&autoload=false``:
        no probe ever names a model that is not loaded, and none omits ``autoload=false``."""
        missing = b'{"error":{"code":400,"message":"model name is missing from the request"}}'
        self.up.script["http://r/slots"] = FakeResponse(400, missing)
        models = {
            "data": [
                {"id": "a b", "status": {"value": "loaded"}},
                {"id": "c", "status": {"value": "unloaded"}},
                {"id": "d", "status": {"value": "loading"}},
            ]
        }
        self.up.script["http://r/models"] = FakeResponse(200, json.dumps(models).encode())
        self.up.script["http://r/slots?model=a%20b&autoload=false"] = slots(1, 4)
        self.traffic = True
        self.poller("http://r")
        self.clock.advance(FAST)
        self.assertEqual(self.ledger.free("http://r"), 3)
        self.assertEqual(self.reports[-1][1].total, 4)
        self.assertIs(self.states.modelLoaded("http://r", "a b"), True)
        self.assertIs(self.states.modelLoaded("http://r", "d"), False)
        report = self.reports[-1][1]
        self.assertTrue(report.router)
        self.assertEqual(
            [(m.name, m.state) for m in report.resident or ()],
            [("a b", "loaded"), ("d", "loading")],
        )
        self.clock.advance(3 * FAST)
        asked = [c[3] for c in self.up.calls]
        self.assertEqual(asked[0], b"/slots")
        self.assertEqual(set(asked[1:]), {b"/models", b"/slots?model=a%20b&autoload=false"})
        self.assertEqual(self.states.status()["http://r"]["probe"], "/models (router)")
        self.assertEqual([e["log_format"] for e in self.events], [])

    def test_loadingProbedOften(self) -> None:
        """Idle, a router is probed every second while it says a model is loading, then
        backs off again."""
        self.up.script["http://r/slots"] = FakeResponse(400)
        loading = {"data": [{"id": "a", "status": {"value": "loading"}}]}
        self.up.script["http://r/models"] = FakeResponse(200, json.dumps(loading).encode())
        self.poller("http://r")
        self.assertEqual(self.probeTimes(6), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        loaded = {"data": [{"id": "a", "status": {"value": "loaded"}}]}
        self.up.script["http://r/models"] = FakeResponse(200, json.dumps(loaded).encode())
        self.up.script["http://r/slots?model=a&autoload=false"] = slots(0)
        times = sorted(set(self.probeTimes(30)))  # a probe: the list, then a's slots
        self.assertEqual([b - a for a, b in zip(times, times[1:], strict=False)][-2:], [SLOW, SLOW])

    def test_notARouterStaysOnItsProbes(self) -> None:
        """A server answering ``/slots`` 400 whose ``/models`` carries no statuses is no
        router: it is never asked its list again, and its 400 is a problem like any other."""
        self.up.script["http://s/slots"] = FakeResponse(400, b"{}")
        single = {"object": "list", "data": [{"id": "m", "object": "model"}]}
        self.up.script["http://s/models"] = FakeResponse(200, json.dumps(single).encode())
        self.traffic = True
        self.poller("http://s")
        self.clock.advance(5 * FAST)
        asked = [c[3] for c in self.up.calls]
        self.assertEqual(asked.count(b"/models"), 1)
        self.assertIsNone(self.ledger.free("http://s"))
        self.assertEqual(self.states.status()["http://s"]["problem"], "status 400")

    def test_lmstudioV1ThenV0(self) -> None:
        """LM Studio is read through its v1 REST API; a server without it (404) through
        ``/api/v0/models`` from then on."""
        v1 = {"models": [{"key": "q", "loaded_instances": [{"id": "q", "config": {}}]}]}
        self.up.script["http://new/api/v1/models"] = FakeResponse(200, json.dumps(v1).encode())
        self.up.script["http://old/api/v1/models"] = FakeResponse(404)
        v0 = {"data": [{"id": "q", "state": "loaded"}]}
        self.up.script["http://old/api/v0/models"] = FakeResponse(200, json.dumps(v0).encode())
        self.traffic = True
        self.poller("http://new", "http://old", engine=LMSTUDIO)
        self.clock.advance(FAST)
        for url in ("http://new", "http://old"):
            self.assertIs(self.states.modelLoaded(url, "q"), True)
        self.assertEqual(self.states.status()["http://old"]["probe"], "/api/v0/models")

    def test_routerStopCancelsChildProbes(self) -> None:
        """Stopping abandons a router probe waiting on a model's slots; no timer is left."""
        self.up.script["http://r/slots"] = FakeResponse(400)
        models = {"data": [{"id": "a", "status": {"value": "loaded"}}]}
        self.up.script["http://r/models"] = FakeResponse(200, json.dumps(models).encode())
        self.up.script["http://r/slots?model=a&autoload=false"] = "hang"
        self.traffic = True
        poller = self.poller("http://r")
        self.clock.advance(FAST)
        poller.stopService()
        self.assertEqual(self.up.cancelled, ["http://r"])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_setBackends(self) -> None:
        """The backend set can change while running: new ones probed at once, removed ones
        forgotten (their probe abandoned, their state dropped)."""
        self.up.script["http://a/slots"] = slots(0)
        self.up.script["http://b/slots"] = "hang"
        self.up.script["http://c/slots"] = slots(1)
        poller = self.poller("http://a", "http://b")
        poller.setBackends(["http://c"])
        self.assertEqual(self.up.cancelled, ["http://b"])
        self.assertEqual(sorted(self.states.status()), ["http://c"])
        self.assertEqual(self.ledger.free("http://c"), 1)

    def test_stopLeavesNothing(self) -> None:
        """Stopping abandons probes in flight and leaves no timer."""
        self.up.script["http://a/slots"] = "hang"
        poller = self.poller("http://a")
        poller.stopService()
        self.assertEqual(self.up.cancelled, ["http://a"])
        self.assertEqual(self.clock.getDelayedCalls(), [])
