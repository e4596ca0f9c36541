"""The model-routed policy (protocol §11 "model-routed, not workloads"; spec §6 "Token
counts"): ``/v1/messages/count_tokens`` and ``/v1/responses/input_tokens`` go to the owners
of the body's model, each at most once, failing over before the first byte; no workload, no
reservation, no backoff; the proxy's own answers in the route's shape."""

from __future__ import annotations

import json

from nvpair.proxy.dispatch.exchange import Exchange
from nvpair.proxy.engines import RouteClass
from tests.support.exchangecase import LoopCase
from tests.support.fakerequest import FakeRequest
from tests.support.fakeupstream import makeFacade, node, startExchange

COUNT = b'{"model":"m1","messages":[{"role":"user","content":"hi"}]}'


class ModelRoutedTests(LoopCase):
    """Owners A and B of ``m1``, and C that does not have it."""

    nodes = ("A", "B")

    def setUp(self) -> None:
        super().setUp()
        self.facade = makeFacade(self.clock, [node("C", models=("other",)), node("A"), node("B")])

    def count(
        self, path: bytes = b"/v1/messages/count_tokens", model: str | None = "m1"
    ) -> tuple[Exchange, FakeRequest]:
        request = FakeRequest(b"POST", path)
        return startExchange(
            self.context,
            self.facade,
            request,
            model=model,
            body=COUNT,
            routeClass=RouteClass.MODEL_ROUTED,
        )

    def test_servedByAnOwner(self) -> None:
        """The first owner answers: its body is relayed, and nothing is a workload."""
        ex, request = self.count()
        self.assertEqual(self.upstream.nodesCalled(), ["A"])
        self.assertEqual(self.context.reservations.totalReserved(), 0, "no reservation")
        self.upstream.last().answer(200, b'{"input_tokens":', b"12}")
        self.assertEqual(request.code, 200)
        self.assertEqual(json.loads(request.body), {"input_tokens": 12})
        self.assertEqual(request.header(b"x-nvpair-node"), [b"A"])
        self.assertEqual(self.events(), [], "not a workload")
        self.assertReleased()

    def test_failsOverOn404And5xxAndTransport(self) -> None:
        """404, 5xx and a refused connection each move on to the next owner, once each;
        a node without the model is never tried."""
        self.facade = makeFacade(self.clock, [node(n) for n in ("A", "B", "C", "D")])
        ex, request = self.count()
        self.upstream.last().answer(404, b"nf")
        self.upstream.last().answer(503, b"busy")
        self.upstream.last().refuse()
        self.upstream.last().answer(200, b'{"input_tokens":3}')
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B", "C", "D"])
        self.assertEqual(request.code, 200)
        self.assertEqual(request.header(b"x-nvpair-attempts"), [b"4"])
        self.assertEqual(self.events(), [])
        self.assertReleased()

    def test_lastOwnerAnswersForItself(self) -> None:
        """Every owner fails: each tried exactly once, no backoff round; the last one's
        answer is the client's."""
        ex, request = self.count()
        self.upstream.last().answer(500, b"x")
        self.upstream.last().answer(404, b'{"error":"not found"}')
        self.clock.advance(1000)
        self.assertEqual(self.upstream.nodesCalled(), ["A", "B"])
        self.assertEqual(request.code, 404)
        self.assertEqual(request.body, b'{"error":"not found"}')
        self.assertReleased()

    def test_lastTransportFailureIs502InTheRoutesShape(self) -> None:
        """The last owner unreachable: 502 ``upstream_unreachable`` in Anthropic's shape."""
        ex, request = self.count()
        self.upstream.last().refuse()
        self.upstream.last().refuse()
        self.assertEqual(request.code, 502)
        doc = json.loads(request.body)
        self.assertEqual(doc["type"], "error")
        self.assertEqual(doc["error"]["type"], "api_error")
        self.assertIn("(upstream_unreachable)", doc["error"]["message"])

    def test_clientErrorIsTheAnswer(self) -> None:
        """A 400 from the first owner is the answer: the request's fault, not the node's."""
        ex, request = self.count()
        self.upstream.last().answer(400, b"bad")
        self.assertEqual(self.upstream.nodesCalled(), ["A"])
        self.assertEqual(request.code, 400)

    def test_noOwner(self) -> None:
        """A model nobody advertises: 502 ``no_owner`` at once, no engine, no workload."""
        ex, request = self.count(model="nobody")
        self.assertEqual(self.upstream.calls, [])
        self.assertEqual(request.code, 502)
        doc = json.loads(request.body)
        self.assertEqual(doc["error"]["type"], "not_found_error")
        self.assertIn("(no_owner)", doc["error"]["message"])
        self.assertEqual(self.events(), [])
        self.assertReleased()

    def test_noOwnerOnResponsesCountIsOpenAIShaped(self) -> None:
        """``/v1/responses/input_tokens`` keeps the OpenAI shape."""
        ex, request = self.count(path=b"/v1/responses/input_tokens", model="nobody")
        self.assertEqual(request.code, 502)
        self.assertEqual(self.errorReason(request), "no_owner")

    def test_noModelIs400(self) -> None:
        """Without a model (admission refuses such a body first) the policy answers 400."""
        ex, request = self.count(model=None)
        self.assertEqual(self.upstream.calls, [])
        self.assertEqual(request.code, 400)
        self.assertIn("(bad_request)", json.loads(request.body)["error"]["message"])

    def test_pinFirst(self) -> None:
        """The pin, when it is an owner, goes first, as on every route."""
        self.facade.pin = "B"
        ex, request = self.count()
        self.assertEqual(self.upstream.nodesCalled(), ["B"])

    def test_ownerThatLeftIsSkipped(self) -> None:
        """An owner that left discovery during the round is not tried."""
        ex, request = self.count()
        self.facade.setSnapshot(
            type(self.facade.snapshot)([node("A")], self.facade.engine.normalize)
        )
        self.upstream.last().answer(503, b"x")
        self.assertEqual(self.upstream.nodesCalled(), ["A"])
        self.assertEqual(request.code, 502)
        self.assertIn("(upstream_unreachable)", json.loads(request.body)["error"]["message"])
