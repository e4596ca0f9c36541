"""Fleet views end to end (protocol §11, §12): merged lists, preflights and CORS passthrough."""

from __future__ import annotations

import json
from typing import Any

import treq
from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase
from twisted.web.http_headers import Headers

from nvpair.proxy.testing.fakeengine import Hang, Status
from tests.support.harness import ProxyFixture, directNode, freePort, startEngine

ORIGIN = "http://app.example"
CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


def listBody(owner: str, *ids: str) -> bytes:
    """An OpenAI model list whose entries name ``owner`` (to see which node's entry won)."""
    return json.dumps(
        {"object": "list", "data": [{"id": i, "object": "model", "owned_by": owner} for i in ids]}
    ).encode()


def deadNode(nodeId: str, models: list[str]) -> dict[str, Any]:
    """A node whose address refuses connections."""
    return {
        "id": nodeId,
        "self": False,
        "addresses": [f"http://127.0.0.1:{freePort()}"],
        "models": models,
    }


def corsOf(response: Any) -> dict[str, list[str]]:
    """The response's ``access-control-*`` headers."""
    return {
        name.decode().lower(): [v.decode() for v in values]
        for name, values in response.headers.getAllRawHeaders()
        if name.lower().startswith(b"access-control-")
    }


class _FleetCase(TestCase):
    """A proxy under a scripted broker with one facade enabled."""

    timeout = 90

    async def _proxy(
        self, engine: str, nodes: list[dict[str, Any]], argv: tuple[str, ...] = ()
    ) -> tuple[ProxyFixture, str]:
        proxy = ProxyFixture(self, reactor, argv)
        await proxy.start()
        port = await proxy.enable(engine)
        await proxy.nodes(engine, nodes)
        return proxy, f"http://127.0.0.1:{port}"


class MergedListTests(_FleetCase):
    """Fleet model lists: every node asked, duplicates merged in candidate order."""

    @defer.inlineCallbacks
    def test_duplicatesAndFailingNodes(self):  # type: ignore[no-untyped-def]
        """Duplicates keep the first node's entry in candidate order (the pin first); a
        refused connection and a 500 are left out; no workload or activity is reported."""
        a = startEngine(self, reactor, "openai", ["m1", "shared"], name="A")
        b = startEngine(self, reactor, "openai", ["m2", "shared"], name="B")
        c = startEngine(self, reactor, "openai", ["m3"], name="C")
        a.listBehaviour = Status(200, listBody("A", "m1", "shared"))
        b.listBehaviour = Status(200, listBody("B", "shared", "m2"))
        c.listBehaviour = Status(500)
        nodes = [directNode("A", a), directNode("B", b), directNode("C", c), deadNode("D", ["m4"])]
        proxy, base = yield defer.Deferred.fromCoroutine(self._proxy("llamacpp", nodes))
        for route in ("/v1/models", "/models"):
            response = yield treq.get(base + route, persistent=False)
            body = yield response.json()
            self.assertEqual(response.code, 200)
            self.assertEqual(body["object"], "list")
            self.assertEqual(
                [(e["id"], e["owned_by"]) for e in body["data"]],
                [("m1", "A"), ("shared", "A"), ("m2", "B")],
            )
        proxy.notify("llamacpp:node/select", {"nodeId": "B"})
        yield proxy.sync()
        response = yield treq.get(base + "/v1/models", persistent=False)
        body = yield response.json()
        self.assertEqual(
            [(e["id"], e["owned_by"]) for e in body["data"]],
            [("shared", "B"), ("m2", "B"), ("m1", "A")],
        )
        # Each llama.cpp list route asks every node GET /models (spec §5).
        self.assertEqual([r.path for r in c.requests], ["/models", "/models", "/models"])
        yield proxy.sync()
        self.assertEqual(proxy.methods("workload:"), [])
        self.assertEqual(proxy.methods("discovery:node-activity"), [])

    @defer.inlineCallbacks
    def test_ollamaTags(self):  # type: ignore[no-untyped-def]
        """Ollama's /api/tags merges by name into ``{"models": [...]}``; /v1/models by id."""
        a = startEngine(self, reactor, "ollama", ["llama3:latest", "qwen:7b"], name="A")
        b = startEngine(self, reactor, "ollama", ["qwen:7b", "phi:2b"], name="B")
        _, base = yield defer.Deferred.fromCoroutine(
            self._proxy("ollama", [directNode("A", a), directNode("B", b)])
        )
        response = yield treq.get(base + "/api/tags", persistent=False)
        body = yield response.json()
        self.assertEqual(list(body), ["models"])
        self.assertEqual(
            [m["name"] for m in body["models"]], ["llama3:latest", "qwen:7b", "phi:2b"]
        )
        response = yield treq.get(base + "/v1/models", persistent=False)
        body = yield response.json()
        self.assertEqual([m["id"] for m in body["data"]], ["llama3:latest", "qwen:7b", "phi:2b"])

    @defer.inlineCallbacks
    def test_emptyFleet(self):  # type: ignore[no-untyped-def]
        """With no nodes each list route answers its engine's empty envelope."""
        proxy = ProxyFixture(self, reactor)
        yield proxy.start()
        ports = {}
        for engine in ("ollama", "lmstudio", "llamacpp"):
            ports[engine] = yield defer.Deferred.fromCoroutine(proxy.enable(engine))
        expected = [
            ("ollama", "/api/tags", {"models": []}),
            ("ollama", "/v1/models", {"object": "list", "data": []}),
            ("lmstudio", "/v1/models", {"object": "list", "data": []}),
            ("lmstudio", "/api/v0/models", {"object": "list", "data": []}),
            ("llamacpp", "/models", {"object": "list", "data": []}),
            ("llamacpp", "/v1/models", {"object": "list", "data": []}),
        ]
        for engine, route, envelope in expected:
            response = yield treq.get(f"http://127.0.0.1:{ports[engine]}{route}", persistent=False)
            body = yield response.json()
            self.assertEqual((engine, route, response.code, body), (engine, route, 200, envelope))

    @defer.inlineCallbacks
    def test_silentNodeTimesOut(self):  # type: ignore[no-untyped-def]
        """A node that never answers is left out after the dial timeout plus 10 s."""
        a = startEngine(self, reactor, "openai", ["m1"], name="A")
        b = startEngine(self, reactor, "openai", ["m2"], name="B")
        b.listBehaviour = Hang()
        _, base = yield defer.Deferred.fromCoroutine(
            self._proxy(
                "llamacpp", [directNode("A", a), directNode("B", b)], ("--dial-timeout", "0.5")
            )
        )
        started = reactor.seconds()
        response = yield treq.get(base + "/v1/models", persistent=False)
        body = yield response.json()
        elapsed = reactor.seconds() - started
        self.assertEqual([m["id"] for m in body["data"]], ["m1"])
        self.assertGreater(elapsed, 9.5)
        self.assertLess(elapsed, 40)
        record = yield b.waitForRequest(1)
        yield record.connectionLost  # the proxy gave up on the silent node's connection


class ListCorsTests(_FleetCase):
    """Fleet lists with an Origin: every responder must agree (protocol §12)."""

    async def _two(self, corsA: dict[str, str], corsB: dict[str, str]) -> tuple[Any, Any, str]:
        a = startEngine(self, reactor, "openai", ["m1"], name="A")
        b = startEngine(self, reactor, "openai", ["m2"], name="B")
        a.corsHeaders = corsA
        b.corsHeaders = corsB
        _, base = await self._proxy("llamacpp", [directNode("A", a), directNode("B", b)])
        return a, b, base

    @defer.inlineCallbacks
    def test_allAllow(self):  # type: ignore[no-untyped-def]
        """When every responder allows the origin the merged list carries it, with Vary."""
        _, _, base = yield defer.Deferred.fromCoroutine(
            self._two({"Access-Control-Allow-Origin": ORIGIN}, {"Access-Control-Allow-Origin": "*"})
        )
        response = yield treq.get(
            base + "/v1/models", headers=Headers({"Origin": [ORIGIN]}), persistent=False
        )
        body = yield response.json()
        self.assertEqual(response.code, 200)
        self.assertEqual(len(body["data"]), 2)
        self.assertEqual(corsOf(response), {"access-control-allow-origin": [ORIGIN]})
        self.assertEqual(response.headers.getRawHeaders("vary"), ["Origin"])

    @defer.inlineCallbacks
    def test_allWildcard(self):  # type: ignore[no-untyped-def]
        """``*`` is kept only when every responder said ``*``."""
        _, _, base = yield defer.Deferred.fromCoroutine(
            self._two({"Access-Control-Allow-Origin": "*"}, {"Access-Control-Allow-Origin": "*"})
        )
        response = yield treq.get(
            base + "/v1/models", headers=Headers({"Origin": [ORIGIN]}), persistent=False
        )
        yield response.content()
        self.assertEqual(corsOf(response), {"access-control-allow-origin": ["*"]})

    @defer.inlineCallbacks
    def test_oneDenies(self):  # type: ignore[no-untyped-def]
        """One responder without permission for the origin makes the list 403 with no CORS."""
        _, _, base = yield defer.Deferred.fromCoroutine(
            self._two({"Access-Control-Allow-Origin": ORIGIN}, {})
        )
        response = yield treq.get(
            base + "/v1/models", headers=Headers({"Origin": [ORIGIN]}), persistent=False
        )
        body = yield response.json()
        self.assertEqual(response.code, 403)
        self.assertEqual(body["error"]["code"], "origin_denied")
        self.assertEqual(corsOf(response), {})
        response = yield treq.get(base + "/v1/models", persistent=False)
        body = yield response.json()
        self.assertEqual((response.code, len(body["data"])), (200, 2))

    @defer.inlineCallbacks
    def test_invalidList(self):  # type: ignore[no-untyped-def]
        """An invalid list is 502 with no partial list; it keeps Allow-Origin when all allowed,
        and a denial elsewhere outranks it (403)."""
        a, b, base = yield defer.Deferred.fromCoroutine(
            self._two(
                {"Access-Control-Allow-Origin": ORIGIN}, {"Access-Control-Allow-Origin": ORIGIN}
            )
        )
        b.listBehaviour = Status(200, b'{"object": "list"}')
        response = yield treq.get(
            base + "/v1/models", headers=Headers({"Origin": [ORIGIN]}), persistent=False
        )
        body = yield response.json()
        self.assertEqual(response.code, 502)
        self.assertNotIn("data", body)
        self.assertEqual(body["error"]["code"], "invalid_inventory")
        self.assertEqual(corsOf(response), {"access-control-allow-origin": [ORIGIN]})
        response = yield treq.get(base + "/v1/models", persistent=False)
        yield response.content()
        self.assertEqual((response.code, corsOf(response)), (502, {}))
        a.corsHeaders = {}
        response = yield treq.get(
            base + "/v1/models", headers=Headers({"Origin": [ORIGIN]}), persistent=False
        )
        yield response.content()
        self.assertEqual((response.code, corsOf(response)), (403, {}))


class PreflightTests(_FleetCase):
    """Multi-target preflights: every node asked without credentials, answers intersected."""

    @defer.inlineCallbacks
    def test_intersection(self):  # type: ignore[no-untyped-def]
        """Methods and headers intersect, Max-Age is the smallest, credentials only if all;
        nodes see Origin and the Access-Control-Request-* headers but no credentials; an
        unreachable node is skipped and nothing becomes a workload."""
        a = startEngine(self, reactor, "openai", ["m1"], name="A")
        b = startEngine(self, reactor, "openai", ["m2"], name="B")
        a.corsHeaders = {
            "Access-Control-Allow-Origin": ORIGIN,
            "Access-Control-Allow-Methods": "GET, POST",
            "Access-Control-Allow-Headers": "Content-Type, X-A",
            "Access-Control-Max-Age": "600",
            "Access-Control-Allow-Credentials": "true",
        }
        b.corsHeaders = {
            "Access-Control-Allow-Origin": ORIGIN,
            "Access-Control-Allow-Methods": "post, PUT",
            "Access-Control-Allow-Headers": "content-type",
            "Access-Control-Max-Age": "60",
        }
        proxy, base = yield defer.Deferred.fromCoroutine(
            self._proxy("llamacpp", [directNode("A", a), directNode("B", b), deadNode("C", ["m3"])])
        )
        response = yield treq.request(
            "OPTIONS",
            base + "/v1/chat/completions",
            headers=Headers(
                {
                    "Origin": [ORIGIN],
                    "Access-Control-Request-Method": ["POST"],
                    "Access-Control-Request-Headers": ["content-type"],
                    "Cookie": ["session=1"],
                    "Authorization": ["Bearer secret"],
                }
            ),
            persistent=False,
        )
        yield response.content()
        self.assertEqual(response.code, 204)
        self.assertEqual(
            corsOf(response),
            {
                "access-control-allow-origin": [ORIGIN],
                "access-control-allow-methods": ["POST"],
                "access-control-allow-headers": ["Content-Type"],
                "access-control-max-age": ["60"],
            },
        )
        for engine in (a, b):
            self.assertEqual(len(engine.requests), 1)
            record = engine.requests[0]
            self.assertEqual((record.method, record.path), ("OPTIONS", "/v1/chat/completions"))
            self.assertEqual(record.headers["origin"], [ORIGIN])
            self.assertEqual(record.headers["access-control-request-method"], ["POST"])
            self.assertEqual(record.headers["access-control-request-headers"], ["content-type"])
            self.assertNotIn("cookie", record.headers)
            self.assertNotIn("authorization", record.headers)
        yield proxy.sync()
        self.assertEqual(proxy.methods("workload:"), [])
        self.assertEqual(proxy.methods("discovery:node-activity"), [])

    @defer.inlineCallbacks
    def test_noResponder(self):  # type: ignore[no-untyped-def]
        """With no node answering, a preflight is 502 without any Access-Control header."""
        _, base = yield defer.Deferred.fromCoroutine(
            self._proxy("llamacpp", [deadNode("C", ["m3"])])
        )
        response = yield treq.request(
            "OPTIONS",
            base + "/v1/chat/completions",
            headers=Headers({"Origin": [ORIGIN], "Access-Control-Request-Method": ["POST"]}),
            persistent=False,
        )
        yield response.content()
        self.assertEqual((response.code, corsOf(response)), (502, {}))


class SingleTargetCorsTests(_FleetCase):
    """Single-target requests pass the engine's CORS headers through, including absence."""

    @defer.inlineCallbacks
    def test_passthrough(self):  # type: ignore[no-untyped-def]
        """The engine's Access-Control-* headers reach the client unchanged; the Origin
        reaches the engine."""
        a = startEngine(self, reactor, "openai", ["m1"], name="A")
        a.corsHeaders = {
            "Access-Control-Allow-Origin": "http://other.example",
            "Access-Control-Expose-Headers": "X-Custom",
        }
        _, base = yield defer.Deferred.fromCoroutine(self._proxy("llamacpp", [directNode("A", a)]))
        response = yield treq.post(
            base + "/v1/chat/completions",
            json=CHAT,
            headers=Headers({"Origin": [ORIGIN]}),
            persistent=False,
        )
        yield response.content()
        self.assertEqual(response.code, 200)
        self.assertEqual(
            corsOf(response),
            {
                "access-control-allow-origin": ["http://other.example"],
                "access-control-expose-headers": ["X-Custom"],
            },
        )
        self.assertEqual(a.requests[0].headers["origin"], [ORIGIN])

    @defer.inlineCallbacks
    def test_absencePassesThrough(self):  # type: ignore[no-untyped-def]
        """An engine that sends no CORS headers gets none added by the proxy."""
        a = startEngine(self, reactor, "openai", ["m1"], name="A")
        _, base = yield defer.Deferred.fromCoroutine(self._proxy("llamacpp", [directNode("A", a)]))
        response = yield treq.post(
            base + "/v1/chat/completions",
            json=CHAT,
            headers=Headers({"Origin": [ORIGIN]}),
            persistent=False,
        )
        yield response.content()
        self.assertEqual((response.code, corsOf(response)), (200, {}))
        response = yield treq.get(
            base + "/props", headers=Headers({"Origin": [ORIGIN]}), persistent=False
        )
        yield response.content()
        self.assertEqual((response.code, corsOf(response)), (200, {}))

    @defer.inlineCallbacks
    def test_generatedErrorsGrantNothing(self):  # type: ignore[no-untyped-def]
        """An error the proxy generates (502 no_owner) carries no Access-Control header."""
        a = startEngine(self, reactor, "openai", ["m1"], name="A")
        a.corsHeaders = {"Access-Control-Allow-Origin": "*"}
        _, base = yield defer.Deferred.fromCoroutine(self._proxy("llamacpp", [directNode("A", a)]))
        response = yield treq.post(
            base + "/v1/chat/completions",
            json={**CHAT, "model": "x"},
            headers=Headers({"Origin": [ORIGIN]}),
            persistent=False,
        )
        yield response.content()
        self.assertEqual((response.code, corsOf(response)), (502, {}))
