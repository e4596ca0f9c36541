"""Whose word counts in a trace, against the real process with ``--otel`` (issue 32, item
7 and item 1's span part): a client's sampled flag forces nothing unless the operator picks
a parent-based sampler; an invalid ``tracestate`` never reaches the engine; a huge model
name is exported cut; the SDK writes nothing but our JSON lines on stderr."""

from __future__ import annotations

from typing import Any

import treq
from twisted.internet import reactor
from twisted.trial.unittest import TestCase
from twisted.web.http_headers import Headers

from tests.support.cases.requestcase import asyncTest
from tests.support.harness import startEngine
from tests.support.standaloneharness import StandaloneProxy, backendUp
from tests.tracing.otlpreceiver import SERVER, OTLPReceiver, ReceivedSpan

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
SAMPLED = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01".encode()
BODY = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
HUGE = {"model": "m" * 500, "messages": []}  # within admission's 512, over the 256 kept


def flags(traceparent: str) -> tuple[str, bool]:
    """(trace id, sampled flag) of a ``traceparent`` value."""
    _, traceId, _, flagBits = traceparent.split("-")
    return traceId, bool(int(flagBits, 16) & 1)


class TrustTests(TestCase):
    """One standalone proxy with ``--otel`` at a 0 ratio, and one engine."""

    timeout = 90

    async def proxy(self, receiver: OTLPReceiver, sampler: str | None) -> tuple[Any, Any]:
        engine = startEngine(self, reactor, "openai", ["m1"], name="A")
        env = receiver.environ("trust-under-test")
        env.pop("OTEL_TRACES_SAMPLER")
        if sampler is not None:
            env["OTEL_TRACES_SAMPLER"] = sampler
        env["OTEL_TRACES_SAMPLER_ARG"] = "0"
        proxy = StandaloneProxy(
            self, reactor, ("llamacpp",), [("llamacpp", engine.url)], extra=("--otel",), env=env
        )
        await proxy.start()
        await proxy.waitForLog(backendUp(engine.url))
        return proxy, engine

    async def post(
        self, proxy: StandaloneProxy, body: Any, headers: dict[bytes, list[bytes]]
    ) -> int:
        response = await treq.post(
            proxy.url("llamacpp") + "/v1/chat/completions",
            json=body,
            headers=Headers(headers),
            persistent=False,
        )
        await response.content()
        code: int = response.code
        return code

    @asyncTest
    async def test_clientFlagIgnored(self) -> None:
        """No ``OTEL_TRACES_SAMPLER``, ratio 0: the client's sampled ``traceparent`` is
        continued (its trace id) but not sampled, its invalid ``tracestate`` not passed on,
        and nothing at all is exported."""
        receiver = OTLPReceiver(self, reactor)
        proxy, engine = await self.proxy(receiver, None)
        headers = {b"traceparent": [SAMPLED], b"tracestate": [b"k=v,k=\x9b31m"]}
        self.assertEqual(await self.post(proxy, BODY, headers), 200)
        self.assertEqual(await self.post(proxy, HUGE, {b"traceparent": [SAMPLED]}), 502)
        [sent] = [r for r in engine.requests if r.path == "/v1/chat/completions"]
        self.assertEqual(flags(sent.headers["traceparent"][0]), (CLIENT_TRACE, False))
        self.assertNotIn("tracestate", sent.headers)
        self.assertEqual(await proxy.stop(), 0)  # the stop flushes whatever was buffered
        self.assertEqual(receiver.spans, [])
        self.assertEqual(proxy.events("unparsed"), [])

    @asyncTest
    async def test_operatorTrustsParent(self) -> None:
        """``OTEL_TRACES_SAMPLER=parentbased_traceidratio`` at 0: the client's flag is
        followed (sampled, exported), a request without one is not sampled; a 500-character
        model name is exported as its first 256 characters."""
        receiver = OTLPReceiver(self, reactor)
        proxy, engine = await self.proxy(receiver, "parentbased_traceidratio")
        self.assertEqual(await self.post(proxy, BODY, {b"traceparent": [SAMPLED]}), 200)
        self.assertEqual(await self.post(proxy, BODY, {}), 200)
        self.assertEqual(await self.post(proxy, HUGE, {b"traceparent": [SAMPLED]}), 502)
        first, second = [r for r in engine.requests if r.path == "/v1/chat/completions"]
        self.assertEqual(flags(first.headers["traceparent"][0]), (CLIENT_TRACE, True))
        self.assertEqual(flags(second.headers["traceparent"][0])[1], False)
        self.assertEqual(await proxy.stop(), 0)
        servers: list[ReceivedSpan] = [s for s in receiver.spans if s.kind == SERVER]
        self.assertEqual(len(servers), 2)
        self.assertEqual({s.traceId for s in servers}, {CLIENT_TRACE})
        models = sorted(len(s.attributes["gen_ai.request.model"]) for s in servers)
        self.assertEqual(models, [2, 256])
        self.assertLess(max(len(b) for b in receiver.bodies), 64 * 1024)
        self.assertEqual(proxy.events("unparsed"), [])
