"""The engine's identity probe on a ``Clock``: asked once after a backend's first report,
it says whether the engine's prompt cache moves saved prompts (llama.cpp's ``/props``)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.engines import LLAMACPP, OLLAMA, Engine
from nvpair.proxy.facade.enginepoller import FAST, EnginePoller
from nvpair.proxy.nodestate.ledger import RoomLedger
from nvpair.proxy.nodestate.probes import parseIdentity
from nvpair.proxy.nodestate.states import EngineStates
from tests.facade.fleetkit import FakeResponse, FakeUpstream, runningPoller

SLOTS = FakeResponse(200, json.dumps([{"id": 0, "is_processing": False}]).encode())
PROPS = {"total_slots": 2, "build_info": "b7100-1a2b3c4", "model_path": "/m.gguf"}


def props(doc: object = PROPS, code: int = 200) -> FakeResponse:
    return FakeResponse(code, json.dumps(doc).encode())


class IdentityParseTests(SynchronousTestCase):
    """``parseIdentity``: llama-server's ``/props`` names its build; nothing else does."""

    def test_llamaServerProps(self) -> None:
        self.assertTrue(parseIdentity(json.dumps(PROPS).encode()))

    def test_othersDoNot(self) -> None:
        """Another server's JSON, a build that is not a string, garbage: it does not move."""
        for body in (b'{"total_slots": 2}', b'{"build_info": 7}', b"[1]", b"<html>", b""):
            self.assertFalse(parseIdentity(body), body)

    @given(st.binary(max_size=256))
    def test_anyBytes(self, body: bytes) -> None:
        """Whatever a backend answers, the parser says yes or no and never raises."""
        self.assertIsInstance(parseIdentity(body), bool)


class IdentityTableTests(SynchronousTestCase):
    """What the identity probes said, kept per node: bounded, and forgotten with the node."""

    def test_boundedByNodes(self) -> None:
        """Beyond ``maxNodes`` nodes an answer is not kept (the node is taken as copying);
        a kept node's answer may change, and leaving frees its place."""
        clock = Clock()
        states = EngineStates(clock, RoomLedger(clock, {}), maxNodes=2)
        for nodeId in ("a", "b", "c"):
            states.identified(nodeId, True)
        self.assertEqual([states.identity(n) for n in "abc"], [True, True, None])
        self.assertFalse(states.promptsMove("c"))
        states.identified("a", False)
        self.assertIs(states.identity("a"), False)
        states.forget("b")
        states.identified("c", True)
        self.assertTrue(states.promptsMove("c"))


class IdentityProbeTests(SynchronousTestCase):
    """The poller asks ``/props`` once per backend after its first report."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.up = FakeUpstream()
        self.ledger = RoomLedger(self.clock, {})
        self.states = EngineStates(self.clock, self.ledger)

    def poller(self, engine: Engine = LLAMACPP) -> EnginePoller:
        return runningPoller(
            self, engine, ["http://a"], self.up, self.clock, self.states, self.ledger, lambda: True
        )

    def paths(self) -> list[bytes]:
        return [call[3] for call in self.up.calls]

    def test_askedOnceAfterTheFirstReport(self) -> None:
        """The first ``/slots`` answer brings one ``/props``: its build says the prompt
        cache moves (``/status`` shows it); later probes do not ask again."""
        self.up.script["http://a/slots"] = SLOTS
        self.up.script["http://a/props"] = props()
        self.poller()
        self.clock.advance(3 * FAST)
        self.assertEqual(self.paths().count(b"/props"), 1)
        self.assertGreater(self.paths().count(b"/slots"), 1)
        self.assertTrue(self.states.promptsMove("http://a"))
        self.assertEqual(self.states.status()["http://a"]["promptCache"], "moves")

    def test_otherServersDoNotMove(self) -> None:
        """A ``/props`` answered 404, or without a build: known not to move, not asked
        again."""
        for answer in (props(code=404), props({"total_slots": 2})):
            self.setUp()
            self.up.script["http://a/slots"] = SLOTS
            self.up.script["http://a/props"] = answer
            self.poller()
            self.clock.advance(3 * FAST)
            self.assertEqual(self.paths().count(b"/props"), 1)
            self.assertIs(self.states.identity("http://a"), False)
            self.assertFalse(self.states.promptsMove("http://a"))

    def test_failureAskedAgain(self) -> None:
        """A ``/props`` that fails says nothing: asked again after the next report."""
        self.up.script["http://a/slots"] = SLOTS
        self.up.script["http://a/props"] = ConnectionRefusedError()
        self.poller()
        self.assertIsNone(self.states.identity("http://a"))
        self.up.script["http://a/props"] = props()
        self.clock.advance(FAST)
        self.assertEqual(self.paths().count(b"/props"), 2)
        self.assertTrue(self.states.promptsMove("http://a"))

    def test_noReportNoIdentity(self) -> None:
        """A backend whose state probe fails is not asked who it is."""
        self.up.script["http://a/slots"] = ConnectionRefusedError()
        self.poller()
        self.clock.advance(3 * FAST)
        self.assertNotIn(b"/props", self.paths())

    def test_engineWithoutIdentity(self) -> None:
        """Ollama has no identity probe: its reports ask nothing more."""
        self.up.script["http://a/api/ps"] = FakeResponse(200, b'{"models": []}')
        self.poller(OLLAMA)
        self.clock.advance(3 * FAST)
        self.assertEqual(set(self.paths()), {b"/api/ps"})
        self.assertFalse(self.states.promptsMove("http://a"))

    def test_forgottenWithItsBackend(self) -> None:
        """A backend that leaves the fleet takes its identity along; one still asked is
        cancelled."""
        self.up.script["http://a/slots"] = SLOTS
        self.up.script["http://a/props"] = props()
        poller = self.poller()
        self.assertTrue(self.states.promptsMove("http://a"))
        self.up.script["http://b/slots"] = SLOTS
        self.up.script["http://b/props"] = "hang"
        poller.setBackends(["http://b"])
        self.assertIsNone(self.states.identity("http://a"))
        poller.setBackends([])
        self.assertEqual(self.up.cancelled, ["http://b"])
