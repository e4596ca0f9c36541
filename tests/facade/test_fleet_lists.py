"""Fleet model lists (protocol §11) over a scripted upstream: merge order, fallbacks, nodes
left out, time limits and cancellation; the bounded body reader; the fakes' interfaces."""

from __future__ import annotations

import json

from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IPushProducer
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.iweb import IResponse
from zope.interface.verify import verifyObject

from nvpair.proxy.engines import LLAMACPP, OLLAMA
from nvpair.proxy.facade.fleet import MAX_LIST_BYTES, NODE_GRACE, IFleetViews, collect
from nvpair.proxy.interfaces import IUpstream
from tests.facade.fleetkit import (
    DIAL,
    FakeBody,
    FakeResponse,
    FakeUpstream,
    FleetCase,
    fleetFacade,
    node,
    openaiList,
)


class FakeTests(FleetCase):
    """The fakes and the fleet provide the interfaces they stand for."""

    def test_interfaces(self) -> None:
        """The upstream, a response body's transport and the fleet views."""
        self.assertTrue(verifyObject(IUpstream, FakeUpstream()))
        self.assertTrue(verifyObject(IPushProducer, FakeBody()))
        self.assertTrue(verifyObject(IResponse, FakeResponse(200)))
        self.assertTrue(verifyObject(IFleetViews, self.fleet))


class ModelListTests(FleetCase):
    """Fleet model lists (protocol §11)."""

    def test_mergeInCandidateOrder(self) -> None:
        """Duplicates keep the entry of the first node in candidate order; the pin goes first."""
        up = self.context.upstream
        up.script["http://a"] = FakeResponse(200, openaiList("a", "m1", "shared"))
        up.script["http://b"] = FakeResponse(200, openaiList("b", "shared", "m2"))
        facade = fleetFacade(LLAMACPP, [node("B", "http://b"), node("A", "http://a")])
        stub = self.serve(facade)
        response, body = self.get(stub, "/v1/models")
        self.assertEqual(response.code, 200)
        doc = json.loads(body)
        self.assertEqual(doc["object"], "list")
        self.assertEqual(
            [(e["id"], e["owned_by"]) for e in doc["data"]],
            [("m1", "a"), ("shared", "a"), ("m2", "b")],
        )
        facade.pin = "B"
        _, body = self.get(stub, "/v1/models")
        self.assertEqual(
            [(e["id"], e["owned_by"]) for e in json.loads(body)["data"]],
            [("shared", "b"), ("m2", "b"), ("m1", "a")],
        )

    def test_schedulerOrder(self) -> None:
        """Scheduler-listed nodes come before the default order."""
        up = self.context.upstream
        up.script["http://a"] = FakeResponse(200, openaiList("a", "shared"))
        up.script["http://b"] = FakeResponse(200, openaiList("b", "shared"))
        self.context.reservations.applyPriority(1, ("B",), {})
        stub = self.serve(fleetFacade(LLAMACPP, [node("A", "http://a"), node("B", "http://b")]))
        _, body = self.get(stub, "/models")
        self.assertEqual(json.loads(body)["data"], [{"id": "shared", "owned_by": "b"}])

    def test_fallsBackToV1OnNotFound(self) -> None:
        """A node that answers 404 on GET /models is asked GET /v1/models and is merged."""
        up = self.context.upstream
        up.script["http://a/models"] = FakeResponse(404, b"not found")
        up.script["http://a/v1/models"] = FakeResponse(200, openaiList("a", "m1"))
        up.script["http://b/models"] = FakeResponse(200, openaiList("b", "m2"))
        nodes = [node("A", "http://a"), node("B", "http://b")]
        response, body = self.get(self.serve(fleetFacade(LLAMACPP, nodes)), "/models")
        self.assertEqual(response.code, 200)
        self.assertEqual([e["id"] for e in json.loads(body)["data"]], ["m1", "m2"])
        self.assertEqual(
            sorted((c[0], c[3]) for c in up.calls),
            [("A", b"/models"), ("A", b"/v1/models"), ("B", b"/models")],
        )

    def test_failingNodesLeftOut(self) -> None:
        """Refused connections, non-2xx answers and self nodes without a backend are left out."""
        up = self.context.upstream
        up.script["http://a"] = FakeResponse(200, openaiList("a", "m1"))
        up.script["http://b"] = ConnectionRefusedError()
        up.script["http://c"] = FakeResponse(404, b"not found")
        up.script["http://d"] = FakeResponse(503, b"busy")
        nodes = [
            node("A", "http://a"),
            node("B", "http://b"),
            node("C", "http://c"),
            node("D", "http://d"),
            node("S", isSelf=True),
        ]
        response, body = self.get(self.serve(fleetFacade(LLAMACPP, nodes)), "/v1/models")
        self.assertEqual(response.code, 200)
        self.assertEqual([e["id"] for e in json.loads(body)["data"]], ["m1"])
        # C answered 404 on GET /models, so it was asked /v1/models too (spec §5).
        self.assertEqual(sorted(c[0] for c in up.calls), ["A", "B", "C", "C", "D"])

    def test_addressesAndSelf(self) -> None:
        """A self node is asked at the local backend; a node's next address is tried when the
        first refuses; the request path and query travel unchanged, without Accept-Encoding."""
        up = self.context.upstream
        up.script["http://local"] = FakeResponse(200, openaiList("s", "s1"))
        up.script["http://x1"] = ConnectionRefusedError()
        up.script["peer:7000"] = FakeResponse(200, openaiList("p", "p1"))
        facade = fleetFacade(
            LLAMACPP,
            [node("S", isSelf=True), node("P", "http://x1", "peer:7000")],
            localBackend="http://local",
        )
        _, body = self.get(
            self.serve(facade),
            "/v1/models?x=1",
            headers={"Accept-Encoding": "gzip", "Authorization": "Bearer k"},
        )
        self.assertEqual([e["id"] for e in json.loads(body)["data"]], ["s1", "p1"])
        # llama.cpp's list routes ask each node GET /models (spec §5), query kept.
        self.assertEqual(
            [(c[0], c[1], c[2], c[3]) for c in up.calls],
            [
                ("S", "http://local", b"GET", b"/models?x=1"),
                ("P", "http://x1", b"GET", b"/models?x=1"),
                ("P", "peer:7000", b"GET", b"/models?x=1"),
            ],
        )
        sent = up.calls[0][4]
        self.assertFalse(sent.hasHeader(b"accept-encoding"))
        self.assertEqual(sent.getRawHeaders(b"authorization"), [b"Bearer k"])

    def test_timeout(self) -> None:
        """A node still silent after the dial timeout plus 10 s is cancelled and left out."""
        up = self.context.upstream
        up.script["http://a"] = FakeResponse(200, openaiList("a", "m1"))
        up.script["http://b"] = "hang"
        stub = self.serve(fleetFacade(LLAMACPP, [node("A", "http://a"), node("B", "http://b")]))
        d = stub.get("http://proxy/v1/models")
        stub.flush()
        self.assertNoResult(d)
        self.context.clock.advance(DIAL + NODE_GRACE - 0.1)
        stub.flush()
        self.assertNoResult(d)
        self.context.clock.advance(0.1)
        stub.flush()
        response = self.successResultOf(d)
        body = self.successResultOf(stub.content(response))
        self.assertEqual([e["id"] for e in json.loads(body)["data"]], ["m1"])
        self.assertEqual(up.cancelled, ["http://b"])

    def test_bodyTimeout(self) -> None:
        """A node whose body never ends is stopped at the deadline and left out."""
        held = FakeResponse(200, hold=True)
        self.context.upstream.script["http://a"] = held
        stub = self.serve(fleetFacade(LLAMACPP, [node("A", "http://a")]))
        d = stub.get("http://proxy/v1/models")
        stub.flush()
        self.context.clock.advance(DIAL + NODE_GRACE)
        stub.flush()
        body = self.successResultOf(stub.content(self.successResultOf(d)))
        self.assertEqual(json.loads(body), {"object": "list", "data": []})
        self.assertTrue(held.transport.stopped)

    def test_emptyFleet(self) -> None:
        """No nodes: the engine's empty envelope, Ollama's for /api/tags."""
        response, body = self.get(self.serve(fleetFacade(OLLAMA, [])), "/api/tags")
        self.assertEqual((response.code, json.loads(body)), (200, {"models": []}))
        _, body = self.get(self.serve(fleetFacade(OLLAMA, [])), "/v1/models")
        self.assertEqual(json.loads(body), {"object": "list", "data": []})

    def test_ollamaMergeByName(self) -> None:
        """/api/tags merges by ``name``."""
        up = self.context.upstream
        up.script["http://a"] = FakeResponse(
            200, b'{"models":[{"name":"a:latest"},{"name":"b:1"}]}'
        )
        up.script["http://b"] = FakeResponse(200, b'{"models":[{"name":"b:1"},{"name":"c:2"}]}')
        _, body = self.get(
            self.serve(fleetFacade(OLLAMA, [node("A", "http://a"), node("B", "http://b")])),
            "/api/tags",
        )
        self.assertEqual(
            json.loads(body), {"models": [{"name": "a:latest"}, {"name": "b:1"}, {"name": "c:2"}]}
        )

    def test_noReservationsNoExchangesLeft(self) -> None:
        """A list takes no reservation and leaves nothing registered when done."""
        self.context.upstream.script["http://a"] = FakeResponse(200, openaiList("a", "m1"))
        self.get(self.serve(fleetFacade(LLAMACPP, [node("A", "http://a")])), "/v1/models")
        self.assertEqual(self.context.reservations.totalReserved(), 0)
        self.assertEqual(self.context.exchanges, set())

    def test_invalidListIs502(self) -> None:
        """One invalid list makes the answer 502 with no partial list."""
        up = self.context.upstream
        up.script["http://a"] = FakeResponse(200, openaiList("a", "m1"))
        up.script["http://b"] = FakeResponse(200, b"[1, 2]")
        response, body = self.get(
            self.serve(fleetFacade(LLAMACPP, [node("A", "http://a"), node("B", "http://b")])),
            "/v1/models",
        )
        self.assertEqual(response.code, 502)
        self.assertEqual(json.loads(body)["error"]["code"], "invalid_inventory")
        self.assertEqual(self.cors(response), {})

    def test_clientGoneCancels(self) -> None:
        """A client that leaves cancels the fleet's requests and nothing is written."""
        self.context.upstream.script["http://a"] = "hang"
        stub = self.serve(fleetFacade(LLAMACPP, [node("A", "http://a")]))
        d = stub.get("http://proxy/v1/models")
        stub.flush()
        self.assertEqual(len(self.context.exchanges), 1)
        d.cancel()
        stub.flush()
        self.failureResultOf(d)
        self.assertEqual(self.context.upstream.cancelled, ["http://a"])
        self.assertEqual(self.context.exchanges, set())
        self.assertEqual(self.context.internal, [])

    def test_shutdownCancels(self) -> None:
        """Stopping the process ends a list in flight (the client is cut off)."""
        self.context.upstream.script["http://a"] = "hang"
        stub = self.serve(fleetFacade(LLAMACPP, [node("A", "http://a")]))
        d = stub.get("http://proxy/v1/models")
        stub.flush()
        for view in list(self.context.exchanges):
            view.shutdown()
        stub.flush()
        self.failureResultOf(d)
        self.assertEqual(self.context.upstream.cancelled, ["http://a"])
        self.assertEqual(self.context.exchanges, set())


class CollectTests(SynchronousTestCase):
    """The bounded body reader."""

    def test_cap(self) -> None:
        """A body over the cap fails and stops the read."""
        response = FakeResponse(200, b"x" * 11)
        failure = self.failureResultOf(collect(response, cap=10))
        self.assertEqual(failure.type.__name__, "BodyTooLarge")
        self.assertTrue(response.transport.stopped)

    def test_withinCap(self) -> None:
        """A body within the cap is returned whole."""
        response = FakeResponse(200, b"x" * 10)
        self.assertEqual(
            self.successResultOf(collect(response, cap=10)),
            b"x" * 10,
        )

    def test_defaultCap(self) -> None:
        """The default cap is 8 MiB."""
        self.assertEqual(MAX_LIST_BYTES, 8 * 1024 * 1024)
