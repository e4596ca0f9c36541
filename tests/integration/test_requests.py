"""The request path end to end (spec §5, §5.1-§5.4): the real process, fake engines, real clients.

Each test runs ``twistd -n nvpair-proxy`` under a scripted broker with short timeouts, puts
fake engines on 127.0.0.1 behind a facade, and talks to the facade with treq or with the
official ``openai`` / ``ollama`` clients (synchronous clients in a thread).
"""

from __future__ import annotations

import json

import ollama
import openai
import treq
from openai.types.chat import ChatCompletionMessageParam
from twisted.internet import defer
from twisted.internet.threads import deferToThread
from twisted.web.client import ResponseFailed

from nvpair.proxy.testing.fakeengine import (
    Answer,
    DieMidStream,
    HangAfterHeaders,
    Status,
)
from tests.support.cases.requestcase import FAST, RequestCase, asyncTest
from tests.support.harness import directNode

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


class OpenAIClientTests(RequestCase):
    """The official openai client against a facade (OpenAI SSE dialect)."""

    def client(self) -> openai.OpenAI:
        client = openai.OpenAI(
            base_url=self.url("/v1"), api_key="unused", max_retries=0, timeout=30.0
        )
        self.addCleanup(client.close)
        return client

    @asyncTest
    async def test_streamingFailover(self) -> None:
        """A answers 503; the stream comes from B intact; A and B each saw one request."""
        await self.setUpProxy()
        a, b = self.engines
        a.script(Status(503))
        client = self.client()

        def run() -> str:
            stream = client.chat.completions.create(model="m1", messages=MESSAGES, stream=True)
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

        text = await deferToThread(run)
        self.assertEqual(text, "tok0tok1tok2")
        self.assertEqual((a.requestCount, b.requestCount), (1, 1))
        method, info = await self.terminal()
        self.assertEqual(
            (method, info["state"], info["scheduledOn"]), ("workload:completed", "completed", "B")
        )

    @asyncTest
    async def test_nonStreamingFailoverOnRefusal(self) -> None:
        """A refuses connections (not listening); B answers a non-streaming completion."""
        await self.setUpProxy()
        a, b = self.engines
        await a.stopListening()
        client = self.client()
        result = await deferToThread(
            lambda: client.chat.completions.create(model="m1", messages=MESSAGES)
        )
        self.assertEqual(result.choices[0].message.content, "tok0tok1tok2")
        self.assertEqual(b.requestCount, 1)

    @asyncTest
    async def test_finalAttemptPassthrough(self) -> None:
        """Every attempt 503: the final attempt's own status and body reach the client."""
        await self.setUpProxy(argv=[*FAST, "--max-dispatch-attempts", "2"])
        a, b = self.engines
        a.script(Status(503, b'{"error":"A busy"}'))
        b.script(Status(503, b'{"error":"B busy"}'))
        client = self.client()
        with self.assertRaises(openai.APIStatusError) as caught:
            await deferToThread(
                lambda: client.chat.completions.create(model="m1", messages=MESSAGES)
            )
        self.assertEqual(caught.exception.status_code, 503)
        self.assertEqual(caught.exception.response.content, b'{"error":"B busy"}')
        self.assertIsNone(caught.exception.response.headers.get("retry-after"))
        method, info = await self.terminal()
        self.assertEqual((info["state"], info["scheduledOn"]), ("failed", "B"))

    @asyncTest
    async def test_truncatedStream(self) -> None:
        """The only owner dies mid-stream: the client sees a broken stream; completed."""
        await self.setUpProxy(names=("A",))
        (a,) = self.engines
        a.script(DieMidStream(afterChunks=2))
        client = self.client()

        def run() -> list[str]:
            got: list[str] = []
            try:
                stream = client.chat.completions.create(model="m1", messages=MESSAGES, stream=True)
                for chunk in stream:
                    got.append(chunk.choices[0].delta.content or "")
            except Exception as e:  # the truncation surfaces as a transport error
                got.append(type(e).__name__)
            return got

        got = await deferToThread(run)
        self.assertEqual(got[:2], ["tok0", "tok1"])
        self.assertEqual(len(got), 3, "the stream ended in an error, not cleanly")
        method, info = await self.terminal()
        self.assertEqual((method, info["state"]), ("workload:completed", "completed"))
        self.assertEqual(a.requestCount, 1, "never retried after commit")


class OllamaClientTests(RequestCase):
    """The official ollama client against the Ollama facade (NDJSON dialect)."""

    engineId = "ollama"
    dialect = "ollama"
    models = ("llama3:latest",)

    def client(self) -> ollama.Client:
        return ollama.Client(host=self.url(""), timeout=30.0)

    @asyncTest
    async def test_streamingFailoverAfterHeaderOnlyAnswer(self) -> None:
        """A sends headers and nothing (header is not commit): B streams the answer."""
        await self.setUpProxy()
        a, b = self.engines
        a.script(HangAfterHeaders())
        client = self.client()

        def run() -> str:
            return "".join(
                part["message"]["content"]
                for part in client.chat(model="llama3", messages=MESSAGES, stream=True)
            )

        text = await deferToThread(run)
        self.assertEqual(text, "tok0tok1tok2")
        first = await a.waitForRequest(1)
        await first.connectionLost  # A's connection was closed when the attempt was dropped
        method, info = await self.terminal()
        self.assertEqual(
            (info["state"], info["scheduledOn"], info["model"]), ("completed", "B", "llama3:latest")
        )
        self.assertEqual(info["stats"]["completionTokens"], 3)

    @asyncTest
    async def test_nonStreamingFailover(self) -> None:
        """A 500, B answers a non-streaming generate."""
        await self.setUpProxy()
        a, b = self.engines
        a.script(Status(500))
        result = await deferToThread(
            lambda: self.client().generate(model="llama3", prompt="hi", stream=False)
        )
        self.assertEqual(result["response"], "tok0tok1tok2")

    @asyncTest
    async def test_noOwner502(self) -> None:
        """A model nobody advertises: 502 no_owner in Ollama's shape, no engine contacted."""
        await self.setUpProxy()
        with self.assertRaises(ollama.ResponseError) as caught:
            await deferToThread(lambda: self.client().chat(model="nope", messages=MESSAGES))
        self.assertEqual(caught.exception.status_code, 502)
        self.assertEqual(sum(e.requestCount for e in self.engines), 0)
        code, headers, body = await self.post("/api/chat", {"model": "nope"})
        self.assertEqual(json.loads(body)["reason"], "no_owner")


class GeneratedAnswerTests(RequestCase):
    """The answers the proxy generates itself (§5.4), seen raw."""

    @asyncTest
    async def test_allRefuse502(self) -> None:
        """Every attempt refused at the transport: the final one answers 502."""
        await self.setUpProxy(argv=[*FAST, "--max-dispatch-attempts", "3"])
        for engine in self.engines:
            await engine.stopListening()
        code, headers, body = await self.post("/v1/chat/completions", {"model": "m1"})
        self.assertEqual(code, 502)
        self.assertEqual(json.loads(body)["error"]["code"], "upstream_unreachable")
        self.assertIsNone(headers.getRawHeaders("retry-after"))

    @asyncTest
    async def test_deadline503(self) -> None:
        """Attempts slower than the deadline allows: 503 deadline_exceeded with Retry-After."""
        await self.setUpProxy(names=("A",), argv=[*FAST, "--retry-after", "7"])
        (a,) = self.engines
        a.default = HangAfterHeaders()
        code, headers, body = await self.post(
            "/v1/chat/completions", {"model": "m1", "stream": True}
        )
        self.assertEqual(code, 503)
        self.assertEqual(headers.getRawHeaders("retry-after"), ["7"])
        self.assertEqual(json.loads(body)["error"]["code"], "deadline_exceeded")
        self.assertEqual(a.requestCount, 2, "2 s attempts, 3 s deadline: budget unspent")

    @asyncTest
    async def test_ownerGone503(self) -> None:
        """The owner leaves after a dispatch and never returns: 503 owner_unavailable."""
        await self.setUpProxy(names=("A",))
        (a,) = self.engines
        a.script(HangAfterHeaders())
        d = defer.Deferred.fromCoroutine(
            self.post("/v1/chat/completions", {"model": "m1", "stream": True})
        )
        await a.waitForRequest(1)
        await self.proxy.nodes(self.engineId, [])
        code, headers, body = await d
        self.assertEqual(code, 503)
        self.assertEqual(json.loads(body)["error"]["code"], "owner_unavailable")
        self.assertEqual(headers.getRawHeaders("retry-after"), ["10"])

    @asyncTest
    async def test_noContent504(self) -> None:
        """The only permitted attempt sends headers and no content: 504 no_content."""
        await self.setUpProxy(names=("A",), argv=[*FAST, "--max-dispatch-attempts", "1"])
        self.engines[0].script(HangAfterHeaders())
        code, headers, body = await self.post(
            "/v1/chat/completions", {"model": "m1", "stream": True}
        )
        self.assertEqual(code, 504)
        self.assertEqual(json.loads(body)["error"]["code"], "no_content")
        method, info = await self.terminal()
        self.assertEqual(info["state"], "failed")


class CancellationIntegrationTests(RequestCase):
    """Client disconnect and discovery loss, seen from the engine's side."""

    @asyncTest
    async def test_clientDisconnectClosesUpstream(self) -> None:
        """The client gives up while A withholds content: A's connection closes; cancelled."""
        await self.setUpProxy(names=("A",), argv=[*FAST, "--response-header-timeout", "30s"])
        (a,) = self.engines
        a.script(HangAfterHeaders())
        d = treq.post(
            self.url("/v1/chat/completions"), json={"model": "m1", "stream": True}, persistent=False
        )
        received = await a.waitForRequest(1)
        d.cancel()
        with self.assertRaises(Exception):  # noqa: B017 (CancelledError, wrapped or not)
            await d
        await received.connectionLost
        method, info = await self.terminal()
        self.assertEqual((method, info["state"]), ("workload:errored", "cancelled"))
        self.assertEqual(a.requestCount, 1)

    @asyncTest
    async def test_targetLeavesDiscovery(self) -> None:
        """A withholds content; A leaves discovery: B serves at once (long before the cap)."""
        await self.setUpProxy(
            argv=[*FAST, "--response-header-timeout", "30s", "--job-deadline", "60s"]
        )
        a, b = self.engines
        a.script(HangAfterHeaders())
        d = defer.Deferred.fromCoroutine(
            self.post("/v1/chat/completions", {"model": "m1", "stream": True})
        )
        received = await a.waitForRequest(1)
        await self.proxy.nodes(self.engineId, [directNode("B", b)])
        code, headers, body = await d
        self.assertEqual(code, 200)
        self.assertIn(b"tok0", body)
        self.assertEqual(headers.getRawHeaders("x-nvpair-node"), ["B"])
        await received.connectionLost

    @asyncTest
    async def test_truncationVisibleToRawClient(self) -> None:
        """A mid-stream death is a broken response to the client, not a clean end."""
        await self.setUpProxy(names=("A",))
        self.engines[0].script(DieMidStream(afterChunks=1))
        response = await treq.post(
            self.url("/v1/chat/completions"), json={"model": "m1", "stream": True}, persistent=False
        )
        self.assertEqual(response.code, 200)
        with self.assertRaises(ResponseFailed):
            await treq.content(response)

    @asyncTest
    async def test_answerAfterRetryableWithBody(self) -> None:
        """A 429 with a body on A, then B's answer: only B's bytes reach the client."""
        await self.setUpProxy()
        a, b = self.engines
        a.script(Status(429, b'{"error":"slow down"}'))
        b.script(Answer(chunks=2))
        code, headers, body = await self.post("/v1/chat/completions", {"model": "m1"})
        self.assertEqual(code, 200)
        self.assertEqual(json.loads(body)["choices"][0]["message"]["content"], "tok0tok1")
