"""Preloads and unloads through the engines' own APIs, only where the fleet file says so
(protocol §9): the actor on a ``Clock`` with a scripted upstream."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import defer
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.logger import Logger
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.facade.fleetfile import Backend
from nvpair.proxy.facade.modelactor import (
    ATTEMPTS,
    KNOWN_WAIT,
    RETRY_FIRST,
    ModelActions,
)
from nvpair.proxy.facade.modelapi import MODEL_APIS, Outcome, loadSeconds
from nvpair.proxy.interfaces import IUpstream
from nvpair.proxy.nodestate.interfaces import IModelActions, ModelState
from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.probes import EngineReport, ResidentModel
from nvpair.proxy.nodestate.residency import Residency
from nvpair.proxy.nodestate.states import EngineStates
from tests.facade.fleetkit import FakeResponse
from tests.support.fakes.logevents import Events

Answer = FakeResponse | Exception | str


@implementer(IUpstream)
class ScriptedUpstream:
    """Answers each (url, path) from a script (a list: one answer per call, the last one
    repeated); records every call with its body."""

    def __init__(self) -> None:
        self.script: dict[tuple[str, bytes], list[Answer]] = {}
        self.calls: list[tuple[str, bytes, Any]] = []
        self.pending: list[defer.Deferred[Any]] = []

    def request(
        self, node: Any, address: str | None, method: bytes, path: bytes, headers: Headers,
        body: bytes, connected: Callable[[], None] | None = None,
    ) -> defer.Deferred[Any]:  # fmt: skip
        self.calls.append((address or "", path, json.loads(body) if body else None))
        answers = self.script.get((address or "", path), ["hang"])
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if answer == "hang":
            d: defer.Deferred[Any] = defer.Deferred()
            self.pending.append(d)
            return d
        if isinstance(answer, Exception):
            return defer.fail(answer)
        return defer.succeed(answer)


def ok(doc: object = None) -> FakeResponse:
    return FakeResponse(200, json.dumps(doc or {"done": True}).encode())


class ActorCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.ledger = RoomLedger(self.clock, {})
        self.states = EngineStates(self.clock, self.ledger)
        self.residency = Residency(self.clock, self.states, self.ledger)
        self.up = ScriptedUpstream()
        self.events = Events()
        self.patch(ModelActions, "log", Logger(observer=self.events))
        self.actor = ModelActions(self.up, self.clock, self.residency)
        self.addCleanup(self.stop)

    def stop(self) -> None:
        if self.actor.running:
            self.actor.stopService()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def ps(self, url: str, *models: str) -> None:
        """A fresh ``/api/ps``-like report of ``url``."""
        resident = tuple(ResidentModel(m) for m in models)
        report = EngineReport(loaded=frozenset(models), resident=resident)
        self.states.record(url, report, 1e6, "/api/ps")  # fresh for the whole test
        self.residency.observe(url, report)

    def loads(self) -> list[tuple[str, bytes, Any]]:
        return list(self.up.calls)


class PreloadTests(ActorCase):
    """``preload`` at start and after every reload, through each engine's own API."""

    def test_ollamaPreloadsColdModelsOnly(self) -> None:
        """Ollama: a request with no prompt and ``keep_alive: -1`` per cold model, one after
        the other; a model the node holds is skipped; the load's time is learnt."""
        url = "http://o"
        self.ps(url, "a:latest")
        self.up.script[(url, b"/api/generate")] = ["hang"]
        self.actor.setBackends("ollama", [Backend("ollama", url, preload=("a:latest", "b", "c"))])
        self.actor.startService()
        self.assertEqual(self.loads(), [(url, b"/api/generate", {"model": "b", "keep_alive": -1})])
        self.assertIs(self.residency.state(url, "b"), ModelState.LOADING)
        self.clock.advance(7)
        self.up.pending.pop().callback(ok({"done": True, "done_reason": "load"}))
        self.assertEqual(self.residency.loadSeconds(url, "b"), 7.0)
        self.assertEqual([c[2]["model"] for c in self.loads()], ["b", "c"])
        self.assertEqual(self.actor.status()["preloading"], [url])

    def test_routerAndLmStudio(self) -> None:
        """A llama.cpp router is asked ``POST /models/load`` (answered at once; 400 "already
        running" is done); LM Studio its v1 load, only once its models are known."""
        router, lms = "http://r", "http://l"
        self.ps(router)
        self.ps(lms)
        self.up.script[(router, b"/models/load")] = [FakeResponse(400)]
        self.up.script[(lms, b"/api/v1/models/load")] = [ok({"load_time_seconds": 2.5})]
        self.actor.setBackends("llamacpp", [Backend("llamacpp", router, preload=("x", "y"))])
        self.actor.setBackends("lmstudio", [Backend("lmstudio", lms, preload=("q",))])
        self.actor.startService()
        self.assertEqual(
            self.loads(),
            [
                (router, b"/models/load", {"model": "x"}),
                (router, b"/models/load", {"model": "y"}),
                (lms, b"/api/v1/models/load", {"model": "q"}),
            ],
        )
        self.assertEqual(self.residency.loadSeconds(lms, "q"), 2.5)
        self.assertIs(self.residency.state(router, "x"), ModelState.LOADING, "until it says")
        self.assertEqual(self.actor.preloaded, 3)

    def test_lmStudioUnknownIsNotAsked(self) -> None:
        """LM Studio loads a second instance of a loaded model: while its models stay
        unknown it is not asked; Ollama is asked anyway once the wait is over."""
        self.up.script[("http://o", b"/api/generate")] = [ok()]
        self.actor.setBackends("lmstudio", [Backend("lmstudio", "http://l", preload=("q",))])
        self.actor.setBackends("ollama", [Backend("ollama", "http://o", preload=("m",))])
        self.actor.startService()
        for _ in range(int(KNOWN_WAIT)):
            self.clock.advance(1)
        self.assertEqual([c[0] for c in self.loads()], ["http://o"])
        logged = [e["log_format"] for e in self.events]
        self.assertIn("model-preload-skipped", logged)

    def test_retriesThenGivesUp(self) -> None:
        """Down or failing: asked again after 5 s, doubling up to a minute, ``ATTEMPTS``
        times; a refusal (404) is not asked again."""
        url = "http://o"
        self.ps(url)
        self.up.script[(url, b"/api/generate")] = [ConnectionRefusedError()]
        self.actor.setBackends("ollama", [Backend("ollama", url, preload=("m",))])
        self.actor.startService()
        times = [0.0]
        while len(self.up.calls) < ATTEMPTS:
            self.clock.advance(1)
            if len(self.up.calls) > len(times):
                times.append(self.clock.seconds())
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        self.assertEqual(gaps[:4], [RETRY_FIRST, 2 * RETRY_FIRST, 4 * RETRY_FIRST, 8 * RETRY_FIRST])
        self.assertEqual(max(gaps), 60.0)
        self.clock.advance(600)
        self.assertEqual(len(self.up.calls), ATTEMPTS)
        self.assertIn("model-preload-failed", [e["log_format"] for e in self.events])
        self.assertIs(self.residency.state(url, "m"), ModelState.COLD, "not loading after all")

    def test_reloadPreloadsAgain(self) -> None:
        """An applied reload preloads again (a backend's new list at once); a removed
        backend's preload is abandoned."""
        self.ps("http://a")
        self.ps("http://b")
        self.up.script[("http://a", b"/api/generate")] = ["hang"]
        self.up.script[("http://b", b"/api/generate")] = [ok()]
        self.actor.setBackends("ollama", [Backend("ollama", "http://a", preload=("m",))])
        self.actor.startService()
        self.actor.setBackends("ollama", [Backend("ollama", "http://b", preload=("n",))])
        self.assertTrue(self.up.pending[0].called, "the removed backend's load abandoned")
        self.assertEqual([c[0] for c in self.loads()], ["http://a", "http://b"])
        self.assertEqual(self.actor.status()["preload"], {"http://b": ["n"]})


class UnloadTests(ActorCase):
    """``unload`` only where ``unload_idle = true``, and only for an idle model."""

    def test_onlyWhereAllowedAndIdle(self) -> None:
        """Not allowed: nothing sent; allowed but busy: nothing sent; allowed and idle: the
        engine's own unload, and the model's disappearance counts as asked, not evicted."""
        self.ps("http://no", "m")
        self.ps("http://yes", "m")
        self.up.script[("http://yes", b"/api/generate")] = [ok({"done_reason": "unload"})]
        self.actor.setBackends(
            "ollama",
            [Backend("ollama", "http://no"), Backend("ollama", "http://yes", unloadIdle=True)],
        )
        self.actor.startService()
        self.assertTrue(verifyObject(IModelActions, self.actor))
        unload = self.actor.unload
        self.assertFalse(self.successResultOf(unload("http://no", "m")))
        self.residency.began("http://yes", "m")
        self.assertFalse(self.successResultOf(unload("http://yes", "m")))
        self.assertEqual(self.up.calls, [])
        self.residency.ended("http://yes", "m")
        self.assertTrue(self.successResultOf(unload("http://yes", "m")))
        self.assertEqual(
            self.up.calls, [("http://yes", b"/api/generate", {"model": "m", "keep_alive": 0})]
        )
        self.ps("http://yes")
        status = self.residency.nodeStatus("http://yes")
        self.assertEqual((status["unloaded"], status["evictions"]), (1, 0))
        self.assertEqual(self.actor.status()["unloadIdle"], ["http://yes"])

    def test_lmStudioUnloadsItsInstance(self) -> None:
        """LM Studio is asked to unload the instance its models list named."""
        resident = (ResidentModel("q", instance="q:2"),)
        report = EngineReport(resident=resident)
        self.states.record("http://l", report, 100.0, "/api/v1/models")
        self.residency.observe("http://l", report)
        self.up.script[("http://l", b"/api/v1/models/unload")] = [ok({"instance_id": "q:2"})]
        self.actor.setBackends("lmstudio", [Backend("lmstudio", "http://l", unloadIdle=True)])
        self.assertTrue(
            self.successResultOf(defer.ensureDeferred(self.actor.unload("http://l", "q")))
        )
        self.assertEqual(self.up.calls[-1][2], {"instance_id": "q:2"})


class ModelApiTests(SynchronousTestCase):
    """The engines' load and unload requests and what their answers mean."""

    def test_outcomes(self) -> None:
        """2xx done; 408, 429, 5xx again later; other 4xx refused; router 400 done."""
        ollama, router = MODEL_APIS["ollama"], MODEL_APIS["llamacpp"]
        self.assertEqual(
            [ollama.outcome(s) for s in (200, 404, 400, 429, 503)],
            [Outcome.DONE, Outcome.REFUSED, Outcome.REFUSED, Outcome.RETRY, Outcome.RETRY],
        )
        self.assertIs(router.outcome(400), Outcome.DONE)
        self.assertIs(router.outcome(404), Outcome.REFUSED)

    def test_loadSeconds(self) -> None:
        """LM Studio's ``load_time_seconds``, when a sane number."""
        self.assertEqual(loadSeconds(b'{"load_time_seconds": 1.5}'), 1.5)
        for body in (b"", b"[]", b'{"load_time_seconds": true}', b'{"load_time_seconds": -1}'):
            self.assertIsNone(loadSeconds(body))

    @settings(max_examples=300)
    @given(
        st.binary(max_size=200)
        | st.builds(
            lambda v: json.dumps({"load_time_seconds": v}).encode(),
            st.floats() | st.integers() | st.text(max_size=5),
        )
    )
    def test_loadSecondsAnyBody(self, body: bytes) -> None:
        """Whatever a load answers, its load time is None or a sane number of seconds."""
        seconds = loadSeconds(body)
        self.assertTrue(seconds is None or 0 <= seconds <= 3600)
