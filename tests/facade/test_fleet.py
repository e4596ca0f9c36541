"""Unit tests for nvpair.proxy.facade.fleet: merged lists and preflights over a scripted upstream.

The facade's HTTP side is a real ``twisted.web`` site driven in memory by ``StubTreq``;
the upstream is a fake that answers per address; time is a ``Clock``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol, cast

from treq.testing import StubTreq
from twisted.internet import defer
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IProtocol, IPushProducer
from twisted.internet.protocol import ServerFactory
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web import server
from twisted.web.client import ResponseDone
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IResponse
from twisted.web.resource import Resource
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair.proxy.engines import LLAMACPP, OLLAMA, Engine
from nvpair.proxy.facade.facade import Facade
from nvpair.proxy.facade.fleet import MAX_LIST_BYTES, NODE_GRACE, Fleet, IFleetViews, collect
from nvpair.proxy.interfaces import IUpstream
from nvpair.proxy.routing.candidates import Node, Snapshot
from tests.support.fakecontext import FakeContext

ORIGIN = "http://app.example"
DIAL = 2.0


@implementer(IPushProducer)
class FakeBody:
    """The body transport of a fake response: records stopProducing."""

    def __init__(self) -> None:
        self.stopped = False

    def stopProducing(self) -> None:
        self.stopped = True

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass


@implementer(IResponse)
class FakeResponse:
    """An ``IResponse`` with a body delivered at once (or never, when ``hold``)."""

    version = (b"HTTP", 1, 1)
    phrase = b"Phrase"
    length = UNKNOWN_LENGTH
    request = None
    previousResponse = None

    def __init__(
        self,
        code: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        hold: bool = False,
    ) -> None:
        self.code = code
        self.body = body
        self.headers = Headers({k: [v] for k, v in (headers or {}).items()})
        self.hold = hold
        self.transport = FakeBody()

    def setPreviousResponse(self, response: IResponse) -> None:
        pass

    def deliverBody(self, protocol: IProtocol) -> None:
        protocol.makeConnection(self.transport)  # type: ignore[arg-type]
        if self.hold:
            return
        if self.body:
            protocol.dataReceived(self.body)
        protocol.connectionLost(Failure(ResponseDone()))


@implementer(IUpstream)
class FakeUpstream:
    """Answers each address with a scripted response, failure, or a Deferred that never fires."""

    def __init__(self) -> None:
        self.script: dict[str, Any] = {}
        self.calls: list[tuple[str, str | None, bytes, bytes, Headers]] = []
        self.cancelled: list[str] = []

    def request(
        self,
        node: Any,
        address: str | None,
        method: bytes,
        path: bytes,
        headers: Headers,
        body: bytes,
        connected: Callable[[], None] | None = None,
    ) -> defer.Deferred[Any]:
        self.calls.append((node.id, address, method, path, headers))
        answer = self.script.get(f"{address}{path.decode()}", self.script.get(address or ""))
        if answer is None or answer == "hang":
            return defer.Deferred(lambda d: self.cancelled.append(address or ""))
        if isinstance(answer, Exception):
            return defer.fail(answer)
        return defer.succeed(answer)


def _noFactory(aliasOnly: bool) -> ServerFactory:
    raise AssertionError("a fleet test facade never listens")


def fleetFacade(
    engine: Engine,
    nodes: list[Node],
    localBackend: str | None = None,
    pin: str | None = None,
) -> Facade:
    """A facade (never listening) with the state the fleet reads."""
    facade = Facade(engine, MemoryReactorClock(), _noFactory, Snapshot(nodes, engine.normalize))
    if localBackend is not None:
        facade.setLocalBackend(localBackend)
    facade.pin = pin
    return facade


class Client(Protocol):
    """The part of ``StubTreq`` these tests call (it sets its methods at run time)."""

    def request(self, method: str, url: str, **kwargs: Any) -> defer.Deferred[IResponse]: ...

    def get(self, url: str, **kwargs: Any) -> defer.Deferred[IResponse]: ...

    def content(self, response: IResponse) -> defer.Deferred[bytes]: ...

    def flush(self) -> None: ...


class FleetResource(Resource):
    """A leaf resource sending list routes and preflights to the fleet, as the front door does."""

    isLeaf = True

    def __init__(self, fleet: Fleet, facade: Facade) -> None:
        super().__init__()
        self.fleet = fleet
        self.facade = facade

    def render(self, request: Any) -> Any:
        if request.method == b"OPTIONS":
            self.fleet.preflight(self.facade, request)
        else:
            self.fleet.modelList(self.facade, request)
        return server.NOT_DONE_YET


def node(nodeId: str, *addresses: str, isSelf: bool = False) -> Node:
    """A discovery node (inventory is irrelevant to fleet views)."""
    return Node(nodeId, isSelf, addresses, frozenset())


def openaiList(owner: str, *ids: str) -> bytes:
    """An OpenAI list whose entries name ``owner``."""
    return json.dumps(
        {"object": "list", "data": [{"id": i, "owned_by": owner} for i in ids]}
    ).encode()


class _Case(SynchronousTestCase):
    def setUp(self) -> None:
        self.context = FakeContext(upstream=FakeUpstream(), logLevel="debug", dialTimeout=DIAL)
        self.fleet = Fleet(self.context)

    def serve(self, facade: Facade) -> Client:
        return cast(Client, StubTreq(FleetResource(self.fleet, facade)))

    def get(
        self, stub: Client, path: str, headers: dict[str, str] | None = None, method: str = "GET"
    ) -> tuple[Any, bytes]:
        d = stub.request(method, "http://proxy" + path, headers=headers)
        stub.flush()
        response = self.successResultOf(d)
        body = self.successResultOf(stub.content(response))
        return response, body

    def cors(self, response: Any) -> dict[str, str]:
        return {
            name.decode().lower(): b", ".join(values).decode()
            for name, values in response.headers.getAllRawHeaders()
            if name.lower().startswith(b"access-control-")
        }


class FakeTests(_Case):
    """The fakes and the fleet provide the interfaces they stand for."""

    def test_interfaces(self) -> None:
        """The upstream, a response body's transport and the fleet views."""
        self.assertTrue(verifyObject(IUpstream, FakeUpstream()))
        self.assertTrue(verifyObject(IPushProducer, FakeBody()))
        self.assertTrue(verifyObject(IResponse, FakeResponse(200)))
        self.assertTrue(verifyObject(IFleetViews, self.fleet))


class ModelListTests(_Case):
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


class ListCorsTests(_Case):
    """Fleet lists with an Origin (protocol §12)."""

    def facade(self, *answers: FakeResponse) -> Facade:
        nodes = []
        for i, answer in enumerate(answers):
            address = f"http://n{i}"
            self.context.upstream.script[address] = answer
            nodes.append(node(f"N{i}", address))
        return fleetFacade(LLAMACPP, nodes)

    def test_allAllow(self) -> None:
        """Every responder allowed: Allow-Origin (the origin, with Vary), credentials if all."""
        allow = {"Access-Control-Allow-Origin": ORIGIN, "Access-Control-Allow-Credentials": "true"}
        response, body = self.get(
            self.serve(
                self.facade(
                    FakeResponse(200, openaiList("a", "m1"), allow),
                    FakeResponse(200, openaiList("b", "m2"), allow),
                )
            ),
            "/v1/models",
            headers={"Origin": ORIGIN},
        )
        self.assertEqual(response.code, 200)
        self.assertEqual(len(json.loads(body)["data"]), 2)
        self.assertEqual(
            self.cors(response),
            {"access-control-allow-origin": ORIGIN, "access-control-allow-credentials": "true"},
        )
        self.assertEqual(response.headers.getRawHeaders(b"vary"), [b"Origin"])

    def test_denialIs403(self) -> None:
        """A responder that denies (here Ollama-style 403 without headers) makes it 403."""
        allow = {"Access-Control-Allow-Origin": "*"}
        response, body = self.get(
            self.serve(
                self.facade(FakeResponse(200, openaiList("a", "m1"), allow), FakeResponse(403, b""))
            ),
            "/v1/models",
            headers={"Origin": ORIGIN},
        )
        self.assertEqual(response.code, 403)
        self.assertEqual(json.loads(body)["error"]["code"], "origin_denied")
        self.assertEqual(self.cors(response), {})

    def test_denialOutranksInvalid(self) -> None:
        """A denial and an invalid list together answer 403."""
        response, _ = self.get(
            self.serve(
                self.facade(
                    FakeResponse(200, b"nonsense", {"Access-Control-Allow-Origin": "*"}),
                    FakeResponse(200, openaiList("b", "m2")),
                )
            ),
            "/v1/models",
            headers={"Origin": ORIGIN},
        )
        self.assertEqual((response.code, self.cors(response)), (403, {}))

    def test_invalidKeepsAllowOriginWhenAllAllowed(self) -> None:
        """An invalid list with every responder allowing: 502 keeping Allow-Origin only."""
        allow = {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Credentials": "true"}
        response, body = self.get(
            self.serve(
                self.facade(
                    FakeResponse(200, b"{}", allow), FakeResponse(200, openaiList("b", "m2"), allow)
                )
            ),
            "/v1/models",
            headers={"Origin": ORIGIN},
        )
        self.assertEqual(response.code, 502)
        self.assertNotIn(b"m2", body)
        self.assertEqual(self.cors(response), {"access-control-allow-origin": "*"})

    def test_serverErrorsAndFailuresNotResponders(self) -> None:
        """Nodes answering 5xx or failing have no say: the others' permission stands."""
        allow = {"Access-Control-Allow-Origin": ORIGIN}
        facade = self.facade(
            FakeResponse(200, openaiList("a", "m1"), allow), FakeResponse(500, b"oops")
        )
        self.context.upstream.script["http://dead"] = ConnectionRefusedError()
        facade.snapshot = Snapshot(
            [*facade.snapshot.nodes, node("Z", "http://dead")], LLAMACPP.normalize
        )
        response, body = self.get(self.serve(facade), "/v1/models", headers={"Origin": ORIGIN})
        self.assertEqual(response.code, 200)
        self.assertEqual(self.cors(response), {"access-control-allow-origin": ORIGIN})

    def test_emptyFleetGrantsNothing(self) -> None:
        """An empty fleet answers the empty envelope without CORS headers."""
        response, body = self.get(
            self.serve(self.facade()), "/v1/models", headers={"Origin": ORIGIN}
        )
        self.assertEqual((response.code, self.cors(response)), (200, {}))


class PreflightTests(_Case):
    """Multi-target preflights (protocol §12)."""

    PREFLIGHT = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
        "Cookie": "s=1",
        "Authorization": "Bearer k",
    }

    def test_intersectionAndForwardedHeaders(self) -> None:
        """Only Origin and Access-Control-Request-* are sent; the answer is the intersection."""
        up = self.context.upstream
        up.script["http://a"] = FakeResponse(
            204,
            b"",
            {
                "Access-Control-Allow-Origin": ORIGIN,
                "Access-Control-Allow-Methods": "GET, POST",
                "Access-Control-Allow-Headers": "*",
                "Access-Control-Max-Age": "100",
            },
        )
        up.script["http://b"] = FakeResponse(
            200,
            b"",
            {
                "Access-Control-Allow-Origin": "*",
                "Access-Control-Allow-Methods": "POST",
                "Access-Control-Allow-Headers": "Content-Type",
                "Access-Control-Max-Age": "50",
            },
        )
        up.script["http://c"] = FakeResponse(502, b"")
        up.script["http://d"] = ConnectionRefusedError()
        nodes = [node(n, f"http://{n.lower()}") for n in "ABCD"]
        response, body = self.get(
            self.serve(fleetFacade(LLAMACPP, nodes)),
            "/v1/chat/completions",
            headers=self.PREFLIGHT,
            method="OPTIONS",
        )
        self.assertEqual((response.code, body), (204, b""))
        self.assertEqual(
            self.cors(response),
            {
                "access-control-allow-origin": ORIGIN,
                "access-control-allow-methods": "POST",
                "access-control-allow-headers": "Content-Type",
                "access-control-max-age": "50",
            },
        )
        self.assertEqual(response.headers.getRawHeaders(b"vary"), [b"Origin"])
        for _, _, method, path, headers in up.calls:
            self.assertEqual((method, path), (b"OPTIONS", b"/v1/chat/completions"))
            self.assertEqual(
                sorted(name.lower() for name, _ in headers.getAllRawHeaders()),
                [b"access-control-request-headers", b"access-control-request-method", b"origin"],
            )
        self.assertEqual(self.context.reservations.totalReserved(), 0)

    def test_denyingResponderRemovesOrigin(self) -> None:
        """A responder that does not allow the origin leaves the 204 without Allow-Origin."""
        up = self.context.upstream
        up.script["http://a"] = FakeResponse(204, b"", {"Access-Control-Allow-Origin": ORIGIN})
        up.script["http://b"] = FakeResponse(403, b"")
        nodes = [node("A", "http://a"), node("B", "http://b")]
        response, _ = self.get(
            self.serve(fleetFacade(LLAMACPP, nodes)),
            "/v1/chat/completions",
            headers=self.PREFLIGHT,
            method="OPTIONS",
        )
        self.assertEqual((response.code, self.cors(response)), (204, {}))

    def test_noResponderIs502(self) -> None:
        """Only failures and 5xx: 502 without any Access-Control header."""
        up = self.context.upstream
        up.script["http://a"] = FakeResponse(503, b"", {"Access-Control-Allow-Origin": "*"})
        up.script["http://b"] = "hang"
        nodes = [node("A", "http://a"), node("B", "http://b")]
        stub = self.serve(fleetFacade(LLAMACPP, nodes))
        d = stub.request("OPTIONS", "http://proxy/v1/chat/completions", headers=self.PREFLIGHT)
        stub.flush()
        self.assertNoResult(d)
        self.context.clock.advance(DIAL + NODE_GRACE)
        stub.flush()
        response = self.successResultOf(d)
        self.successResultOf(stub.content(response))
        self.assertEqual((response.code, self.cors(response)), (502, {}))

    def test_emptyFleetIs502(self) -> None:
        """No nodes at all: nobody to answer, 502."""
        response, _ = self.get(
            self.serve(fleetFacade(LLAMACPP, [])),
            "/v1/chat/completions",
            headers=self.PREFLIGHT,
            method="OPTIONS",
        )
        self.assertEqual(response.code, 502)


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
