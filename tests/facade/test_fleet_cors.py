"""CORS over the fleet (protocol §12): model lists requested with an Origin, and
multi-target preflights answered with the intersection of what the nodes allow."""

from __future__ import annotations

import json

from twisted.internet.error import ConnectionRefusedError

from nvpair.proxy.engines import LLAMACPP
from nvpair.proxy.facade.facade import Facade
from nvpair.proxy.facade.fleet import NODE_GRACE
from nvpair.proxy.routing.candidates import Snapshot
from tests.facade.fleetkit import (
    DIAL,
    ORIGIN,
    FakeResponse,
    FleetCase,
    fleetFacade,
    node,
    openaiList,
)


class ListCorsTests(FleetCase):
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


class PreflightTests(FleetCase):
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
