"""Admission (protocol §11): route class, the body's model, and the 400 refusal."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from nvpair.proxy.engines import LLAMACPP, LMSTUDIO, OLLAMA, RouteClass
from nvpair.proxy.facade.fleet import IFleetViews
from nvpair.proxy.routing.admission import Admitted, Refused, admit, readBody
from nvpair.proxy.testing.fakecontext import FakeContext
from nvpair.proxy.testing.wire import siteExchange


class ReadBodyTests(SynchronousTestCase):
    """``readBody`` finds the fields of a JSON object body only."""

    def test_found(self) -> None:
        """A JSON object (leading whitespace allowed) is parsed whole."""
        self.assertEqual(readBody(b'{"model": "m1", "x": 1}'), ({"model": "m1", "x": 1}, True))
        self.assertEqual(readBody(b'  \n{"model": ""}'), ({"model": ""}, True))

    def test_notAnObject(self) -> None:
        """Anything else yields no fields."""
        for body in (
            b"",
            b"null",
            b"[]",
            b'["model"]',
            b"{bad json",
            b'"model"',
            b"\xff{",
            b"[" * 100000,
            b"{" * 100000,
        ):
            self.assertIsNone(readBody(body)[0], body[:20])


class AdmitTests(SynchronousTestCase):
    """``admit`` classifies and refuses inference bodies without a model."""

    def test_inferenceAdmitted(self) -> None:
        """An inference body with a model is admitted with the normalized model."""
        decision = admit(OLLAMA, b"POST", b"/api/chat", b'{"model": "llama3"}')
        self.assertEqual(decision, Admitted(RouteClass.INFERENCE, "llama3:latest"))
        decision = admit(LMSTUDIO, b"POST", b"/v1/responses", b'{"model": "llama3"}')
        self.assertEqual(decision, Admitted(RouteClass.INFERENCE, "llama3"))

    def test_inferenceRefused(self) -> None:
        """An inference route without a JSON object body with a string model is 400."""
        for body in (b"", b"[1]", b'{"model": 1}', b"not json", b'{"messages": []}'):
            for engine, path in (
                (OLLAMA, b"/api/generate"),
                (LMSTUDIO, b"/v1/completions"),
                (LLAMACPP, b"/v1/rerank"),
            ):
                decision = admit(engine, b"POST", path, body)
                self.assertIsInstance(decision, Refused)
                assert isinstance(decision, Refused)
                self.assertEqual((decision.status, decision.reason), (400, "bad_request"))
                self.assertNotIn(body.decode("latin-1") or "\0", decision.message)

    def test_modelRouted(self) -> None:
        """A token count is admitted with its normalized model, and refused (400) like an
        inference body without a string model (protocol §11, spec §6 "Token counts")."""
        self.assertEqual(
            admit(OLLAMA, b"POST", b"/v1/messages/count_tokens", b'{"model": "m"}'),
            Admitted(RouteClass.MODEL_ROUTED, "m:latest"),
        )
        for body in (b"", b'{"model": 1}', b"[]", b'{"messages": []}'):
            decision = admit(LLAMACPP, b"POST", b"/v1/responses/input_tokens", body)
            assert isinstance(decision, Refused)
            self.assertEqual((decision.status, decision.reason), (400, "bad_request"))

    def test_verbatimModel(self) -> None:
        """A verbatim request naming a model carries it (normalized) for owner filtering."""
        self.assertEqual(
            admit(OLLAMA, b"POST", b"/api/show", b'{"model": "m"}'),
            Admitted(RouteClass.VERBATIM, "m:latest"),
        )
        self.assertEqual(
            admit(OLLAMA, b"POST", b"/api/pull", b"garbage"), Admitted(RouteClass.VERBATIM, None)
        )
        self.assertEqual(admit(OLLAMA, b"GET", b"/", b""), Admitted(RouteClass.VERBATIM, None))

    def test_fleetList(self) -> None:
        """A fleet list is admitted without a model."""
        self.assertEqual(
            admit(LLAMACPP, b"GET", b"/models", b""), Admitted(RouteClass.FLEET_LIST, None)
        )

    def test_largeBody(self) -> None:
        """A large valid body is parsed for its model."""
        body = json.dumps({"model": "big", "prompt": "x" * 1_000_000}).encode()
        self.assertEqual(
            admit(LLAMACPP, b"POST", b"/v1/completions", body),
            Admitted(RouteClass.INFERENCE, "big"),
        )


class _Facade:
    def __init__(self, engine: Any) -> None:
        self.engine = engine


@implementer(IFleetViews)
class _CrashingFleet:
    """A fleet whose model list raises: an unexpected exception inside request handling."""

    def modelList(self, facade: Any, request: Any) -> None:
        raise ZeroDivisionError("secret-detail")

    def preflight(self, facade: Any, request: Any) -> None:
        raise ZeroDivisionError("secret-detail")


class FrontDoorTests(SynchronousTestCase):
    """Admission answers through a real ``FacadeSite`` over in-memory transports."""

    def setUp(self) -> None:
        from nvpair.proxy.facade.frontdoor import FrontDoor
        from nvpair.proxy.http.site import FacadeSite

        self.clock = Clock()
        self.context = FakeContext()
        from nvpair.proxy.facade.hostcheck import HostGate, HostRule

        door = FrontDoor(
            self.context,
            _Facade(OLLAMA),  # type: ignore[arg-type]  # all a crash reads is the engine
            _CrashingFleet(),
            HostGate(HostRule(["*"]), lambda listener: None),
        )
        self.site = FacadeSite(door, self.clock, 100, 30.0, 65536, OLLAMA)

    def exchange(self, raw: bytes) -> bytes:
        return siteExchange(self.site, raw)

    def test_internalError(self) -> None:
        """An unexpected exception answers 500 internal, reports the type only, and no more."""
        answer = self.exchange(b"GET /api/tags HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertTrue(answer.startswith(b"HTTP/1.1 500 "), answer)
        head, _, body = answer.partition(b"\r\n\r\n")
        self.assertEqual(json.loads(body), {"error": "internal proxy error", "reason": "internal"})
        self.assertEqual(self.context.internal, ["ZeroDivisionError"])
        self.assertNotIn(b"secret-detail", answer)
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)

    def test_keepsServingAfterCrash(self) -> None:
        """After a crash the next request is handled normally."""
        self.exchange(b"GET /api/tags HTTP/1.1\r\nHost: x\r\n\r\n")
        self.flushLoggedErrors(ZeroDivisionError)
        answer = self.exchange(b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n[]")
        self.assertTrue(answer.startswith(b"HTTP/1.1 400 "), answer)
        body = answer.partition(b"\r\n\r\n")[2]
        self.assertEqual(json.loads(body)["reason"], "bad_request")

    def test_bodyTooLarge(self) -> None:
        """A body over ``--max-body`` is 413 ``body_too_large`` in the engine's shape."""
        payload = json.dumps({"model": "m", "x": "y" * 200}).encode()
        answer = self.exchange(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: %d\r\n\r\n" % len(payload) + payload
        )
        self.assertTrue(answer.startswith(b"HTTP/1.1 413 "), answer)
        body = answer.partition(b"\r\n\r\n")[2]
        self.assertEqual(json.loads(body)["error"]["code"], "body_too_large")
        self.assertEqual(self.context.internal, [])

    def test_chunkedBodyTooLarge(self) -> None:
        """A chunked body that grows over the limit is 413 too."""
        chunk = b"z" * 80
        answer = self.exchange(
            b"POST /api/chat HTTP/1.1\r\nHost: x\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + (b"50\r\n" + chunk + b"\r\n") * 2 + b"0\r\n\r\n"
        )
        self.assertTrue(answer.startswith(b"HTTP/1.1 413 "), answer)
