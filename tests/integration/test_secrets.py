"""Secrets stay secret (issue 8, spec §9): a canary in prompts, credentials, query strings,
broker params and engine responses never reaches the log (at debug level), a JSON-RPC
message, or an error body the proxy generates.
"""

from __future__ import annotations

import json
from typing import Any

import treq
from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase

from nvpair.proxy.testing.fakeengine import (
    Answer,
    DieMidStream,
    Drop,
    Echo,
    HangAfterHeaders,
    Status,
)
from nvpair.supervisor.process import JSONRPCError
from tests.support.harness import CANARY, ProxyFixture, directNode, startEngine

SECRET_HEADERS: dict[bytes | str, list[bytes | str]] = {
    "Authorization": [f"Bearer {CANARY}"],
    "Cookie": [f"session={CANARY}"],
    "X-Api-Key": [CANARY],
}
CANARY_BODY = json.dumps({"error": f"engine says {CANARY}"}).encode()


class SecretsTests(TestCase):
    """Every path that could echo request or response content is exercised at debug level."""

    timeout = 120

    async def send(
        self, port: int, path: str, doc: Any = None, raw: bytes | None = None, method: str = "POST"
    ) -> tuple[int, bytes, bool]:
        """One request carrying the canary; returns (status, body, generated-by-proxy)."""
        body = raw if raw is not None else (json.dumps(doc).encode() if doc is not None else None)
        response = await treq.request(
            method,
            f"http://127.0.0.1:{port}{path}",
            headers=SECRET_HEADERS,
            data=body,
            persistent=False,
        )
        try:
            content = await treq.content(response)
        except Exception:
            content = b""
        generated = not response.headers.hasHeader(b"x-nvpair-node")
        return response.code, content, generated

    @defer.inlineCallbacks
    def test_canaryNeverLeaks(self):  # type: ignore[no-untyped-def]
        """Failures, refusals, passthroughs and truncations with the canary everywhere: it
        appears only where an engine's own answer carries it, never in our output."""
        a = startEngine(self, reactor, "openai", ["m1"], name="A")
        b = startEngine(self, reactor, "openai", ["m1"], name="B")
        proxy = ProxyFixture(
            self,
            reactor,
            [
                "--log-level",
                "debug",
                "--max-dispatch-attempts",
                "2",
                "--response-header-timeout",
                "1s",
                "--backoff-base",
                "10ms",
                "--max-body",
                "2000",
            ],
        )
        proxy.level = "debug"
        yield proxy.start()
        port = yield defer.Deferred.fromCoroutine(proxy.enable("llamacpp"))
        yield proxy.nodes("llamacpp", [directNode("A", a), directNode("B", b)])
        proxy.notify("node/set-priority", {"generation": 1, "order": ["A", "B"]})
        prompt = {
            "model": "m1",
            "stream": True,
            "messages": [{"role": "user", "content": f"my key is {CANARY}"}],
        }
        outcomes: list[tuple[str, int, bytes, bool]] = []

        async def case(
            name: str, path: str, doc: Any = None, raw: bytes | None = None, method: str = "POST"
        ) -> None:
            status, body, generated = await self.send(port, path, doc, raw, method)
            outcomes.append((name, status, body, generated))

        chat = "/v1/chat/completions"
        # a retryable status with the canary, then the final attempt's passed through
        for e in (a, b):
            e.script(Status(503, CANARY_BODY))
        yield defer.Deferred.fromCoroutine(case("passthrough", chat, prompt))
        # transport failures: 502 generated
        for e in (a, b):
            e.script(Drop())
        yield defer.Deferred.fromCoroutine(case("unreachable", chat, prompt))
        # hang after headers: 504 generated
        for e in (a, b):
            e.script(HangAfterHeaders())
        yield defer.Deferred.fromCoroutine(case("no_content", chat, prompt))
        # truncated stream
        a.script(DieMidStream(1))
        yield defer.Deferred.fromCoroutine(case("truncated", chat, prompt))
        # a normal answer with a canary response header
        a.script(Answer(headers={"X-Engine-Secret": CANARY}))
        yield defer.Deferred.fromCoroutine(case("answer", chat, prompt))
        # refusals at admission
        yield defer.Deferred.fromCoroutine(
            case("bad_request", chat, {"model": 5, "prompt": CANARY})
        )
        yield defer.Deferred.fromCoroutine(case("not_json", chat, raw=CANARY.encode()))
        yield defer.Deferred.fromCoroutine(
            case("too_large", chat, {"model": "m1", "prompt": CANARY * 200})
        )
        yield defer.Deferred.fromCoroutine(
            case("no_owner", chat, {"model": "nobody", "prompt": CANARY})
        )
        # verbatim routes with the canary in the query string and body
        a.script(Echo())
        yield defer.Deferred.fromCoroutine(case("verbatim", f"/props?token={CANARY}", method="GET"))
        for e in (a, b):
            e.script(Status(500, CANARY_BODY))
        yield defer.Deferred.fromCoroutine(
            case("verbatim-500", f"/slots?key={CANARY}", {"secret": CANARY})
        )
        yield defer.Deferred.fromCoroutine(case("list", f"/v1/models?key={CANARY}", method="GET"))
        # broker messages with the canary in bad params and bad lines
        for method, params in (
            ("log/set-level", {"level": CANARY}),
            ("llamacpp:node/select", {"nodeId": {CANARY: 1}}),
            ("llamacpp:node/set-local-backend", {"url": CANARY}),
            ("facade/enable", {"engine": CANARY, "port": 1}),
        ):
            try:
                yield proxy.request(method, params)
            except JSONRPCError as e:
                self.assertNotIn(CANARY, json.dumps([e.code, str(e), e.data]))
        # (an unknown method name is echoed in its report by design: method names are the
        # broker's vocabulary, not content, so the canary is only put in params and bad lines)
        proxy.notify("llamacpp:discovery:nodes", {"nodes": [{"id": "", "x": CANARY}]})
        proxy.process.writeRaw(b"{" + CANARY.encode() + b"\n")
        proxy.process.writeRaw(
            b'{"jsonrpc":"2.0","id":"s1","method":"log/set-level",'
            b'"params":"' + CANARY.encode() + b'"}\n'
        )
        yield proxy.sync()

        byName = {name: (status, body, generated) for name, status, body, generated in outcomes}
        self.assertEqual(byName["passthrough"][0], 503)
        self.assertIn(CANARY.encode(), byName["passthrough"][1])  # the engine's own body
        self.assertEqual(byName["unreachable"][:1], (502,))
        self.assertEqual(byName["no_content"][:1], (504,))
        self.assertEqual(byName["bad_request"][:1], (400,))
        self.assertEqual(byName["not_json"][:1], (400,))
        self.assertEqual(byName["too_large"][:1], (413,))
        self.assertEqual(byName["no_owner"][:1], (502,))
        for name, _status, body, generated in outcomes:
            if generated:
                self.assertNotIn(CANARY.encode(), body, name)
        self.assertGreater(len(proxy.logs), 5)
        self.assertTrue(any(r.get("level") == "debug" for r in proxy.logs))
        leaked = [r for r in proxy.logs if CANARY in json.dumps(r)]
        self.assertEqual(leaked, [])
        rpc = [m for m in proxy.notifications if CANARY in json.dumps(m)]
        self.assertEqual(rpc, [])
        self.assertEqual([p for p in proxy.protocolErrors if CANARY in p], [])
        self.assertTrue(any(m == "errors:report" for m, _ in proxy.notifications))
