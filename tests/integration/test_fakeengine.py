"""The kit's fake inference engine over real loopback sockets, driven by treq and raw clients."""

from __future__ import annotations

import json

import treq
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectionRefusedError
from twisted.web.client import ResponseFailed, ResponseNeverReceived
from twisted.web.iweb import IResponse

from nvpair.proxy.testing.fakeengine import (
    Answer,
    DieMidStream,
    Drop,
    Echo,
    Hang,
    HangAfterHeaders,
    SlowFirstByte,
    Status,
)
from tests.support.cases.enginecase import CHAT, EngineTestCase, reactor, sleep


class OpenAIAnswerTests(EngineTestCase):
    """The Answer behaviour in the OpenAI dialect."""

    async def test_chatNonStreaming(self) -> None:
        """A non-streaming chat answer echoes the model and carries content and usage."""
        response = await self.post("/v1/chat/completions", dict(CHAT, model="m2"))
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/json"])
        self.assertEqual(response.headers.getRawHeaders("x-fake-engine"), ["fake-openai"])
        doc = json.loads(await treq.content(response))
        self.assertEqual(doc["object"], "chat.completion")
        self.assertEqual(doc["model"], "m2")
        self.assertEqual(doc["choices"][0]["message"]["content"], "tok0tok1tok2")
        self.assertEqual(
            doc["usage"], {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
        )

    async def test_chatStreaming(self) -> None:
        """A streaming chat answer is SSE chunks, a usage chunk, then [DONE]."""
        self.engine.script(Answer(chunks=2))
        response = await self.post("/v1/chat/completions", dict(CHAT, stream=True))
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["text/event-stream"])
        events = (await treq.content(response)).split(b"\n\n")
        self.assertEqual(events[-2:], [b"data: [DONE]", b""])
        docs = [json.loads(e[len(b"data: ") :]) for e in events[:-2]]
        self.assertEqual([d["choices"][0]["delta"]["content"] for d in docs[:2]], ["tok0", "tok1"])
        self.assertEqual(docs[2]["choices"], [])
        self.assertEqual(docs[2]["usage"]["completion_tokens"], 2)

    async def test_streamingWithoutUsage(self) -> None:
        """usage=False leaves out the usage chunk."""
        self.engine.script(Answer(chunks=1, usage=False))
        response = await self.post("/v1/chat/completions", dict(CHAT, stream=True))
        body = await treq.content(response)
        self.assertEqual(body.count(b"data: "), 2)
        self.assertNotIn(b"usage", body)

    async def test_completionsEmbeddingsRerank(self) -> None:
        """Completions, embeddings and rerank answer in their own shapes."""
        doc = await self.postJSON("/v1/completions", {"model": "m1", "prompt": "x"})
        self.assertEqual(doc["choices"][0]["text"], "tok0tok1tok2")
        doc = await self.postJSON("/api/v0/embeddings", {"model": "m1", "input": ["a", "b"]})
        self.assertEqual(len(doc["data"]), 2)
        self.assertEqual(doc["usage"]["prompt_tokens"], 7)
        doc = await self.postJSON(
            "/v1/rerank", {"model": "m1", "query": "q", "documents": ["a", "b", "c"]}
        )
        self.assertEqual([r["index"] for r in doc["results"]], [0, 1, 2])

    async def test_answerStatusAndHeaders(self) -> None:
        """Answer can carry another status and extra headers."""
        self.engine.script(Answer(status=201, headers={"X-Extra": "1"}))
        response = await self.post("/v1/chat/completions", CHAT)
        self.assertEqual(response.code, 201)
        self.assertEqual(response.headers.getRawHeaders("x-extra"), ["1"])
        await treq.content(response)

    async def test_badBody(self) -> None:
        """An inference body without a model gets 400."""
        response = await self.post("/v1/chat/completions", {"messages": []})
        self.assertEqual(response.code, 400)
        await treq.content(response)

    async def test_chunkDelay(self) -> None:
        """chunkDelay spaces streamed chunks on the reactor clock."""
        self.engine.script(Answer(chunks=3, chunkDelay=0.05))
        start = reactor.seconds()
        response = await self.post("/v1/chat/completions", dict(CHAT, stream=True))
        body = await treq.content(response)
        self.assertGreaterEqual(reactor.seconds() - start, 0.1)
        self.assertIn(b"tok2", body)

    async def test_queueThenDefault(self) -> None:
        """Scripted behaviours are consumed in order, then the default applies."""
        self.engine.script(Status(503), Status(429))
        codes = []
        for _ in range(3):
            response = await self.post("/v1/chat/completions", CHAT)
            codes.append(response.code)
            await treq.content(response)
        self.assertEqual(codes, [503, 429, 200])
        self.assertEqual(self.engine.behaviours, [])


class OllamaAnswerTests(EngineTestCase):
    """The Answer behaviour in the Ollama dialect."""

    dialect = "ollama"

    async def test_chatStreamsByDefault(self) -> None:
        """Native /api/chat streams NDJSON unless stream is false."""
        response = await self.post("/api/chat", CHAT)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/x-ndjson"])
        lines = [json.loads(x) for x in (await treq.content(response)).splitlines()]
        self.assertEqual([x["message"]["content"] for x in lines], ["tok0", "tok1", "tok2", ""])
        self.assertEqual([x["done"] for x in lines], [False, False, False, True])
        self.assertEqual(lines[-1]["eval_count"], 3)
        self.assertEqual(lines[-1]["prompt_eval_count"], 7)

    async def test_nonStreaming(self) -> None:
        """stream false gives one document for chat and generate."""
        doc = await self.postJSON("/api/chat", dict(CHAT, stream=False))
        self.assertEqual(doc["message"]["content"], "tok0tok1tok2")
        self.assertTrue(doc["done"])
        doc = await self.postJSON("/api/generate", {"model": "m1", "prompt": "x", "stream": False})
        self.assertEqual(doc["response"], "tok0tok1tok2")

    async def test_openAIRoutesDoNotStreamByDefault(self) -> None:
        """Ollama's /v1 routes stream only when asked."""
        doc = await self.postJSON("/v1/chat/completions", CHAT)
        self.assertEqual(doc["choices"][0]["message"]["content"], "tok0tok1tok2")

    async def test_embed(self) -> None:
        """/api/embed returns one embedding per input."""
        doc = await self.postJSON("/api/embed", {"model": "m1", "input": ["a", "b"]})
        self.assertEqual(len(doc["embeddings"]), 2)

    async def test_tags(self) -> None:
        """/api/tags lists the current models."""
        self.engine.models.append("m3:latest")
        response = await self.http.get(self.engine.url + "/api/tags")
        doc = json.loads(await treq.content(response))
        self.assertEqual([m["name"] for m in doc["models"]], ["m1", "m2", "m3:latest"])


class ListAndCorsTests(EngineTestCase):
    """Model lists, listBehaviour, CORS headers and preflights."""

    async def test_lists(self) -> None:
        """/v1/models, /models and /api/v0/models list the models without using the queue."""
        self.engine.script(Status(500))
        for path in ("/v1/models", "/models", "/api/v0/models"):
            response = await self.http.get(self.engine.url + path)
            doc = json.loads(await treq.content(response))
            self.assertEqual(doc["object"], "list")
            self.assertEqual([m["id"] for m in doc["data"]], ["m1", "m2"])
        self.assertEqual(len(self.engine.behaviours), 1)

    async def test_listBehaviour(self) -> None:
        """listBehaviour replaces the normal list answer."""
        self.engine.listBehaviour = Status(503, b"{}")
        response = await self.http.get(self.engine.url + "/v1/models")
        self.assertEqual(response.code, 503)
        await treq.content(response)

    async def test_cors(self) -> None:
        """corsHeaders go on every answer; OPTIONS answers 204 with them."""
        self.engine.corsHeaders = {"Access-Control-Allow-Origin": "*"}
        url = self.engine.url + "/v1/chat/completions"
        response: IResponse = await self.http.request("OPTIONS", url)
        self.assertEqual(response.code, 204)
        self.assertEqual(response.headers.getRawHeaders("access-control-allow-origin"), ["*"])
        await treq.content(response)
        response = await self.post("/v1/chat/completions", CHAT)
        self.assertEqual(response.headers.getRawHeaders("access-control-allow-origin"), ["*"])
        await treq.content(response)


class BehaviourTests(EngineTestCase):
    """Each failure behaviour is observable over HTTP."""

    async def test_status(self) -> None:
        """Status answers that code and body."""
        self.engine.script(Status(404, b'{"error":"nope"}', {"Retry-After": "1"}))
        response = await self.post("/v1/chat/completions", CHAT)
        self.assertEqual(response.code, 404)
        self.assertEqual(response.headers.getRawHeaders("retry-after"), ["1"])
        self.assertEqual(await treq.content(response), b'{"error":"nope"}')

    async def test_echo(self) -> None:
        """Echo describes the received request; Answer does too on other routes."""
        self.engine.script(Echo())
        doc = await self.postJSON("/v1/chat/completions?x=1", CHAT)
        self.assertEqual(doc["path"], "/v1/chat/completions?x=1")
        self.assertEqual(doc["method"], "POST")
        self.assertEqual(doc["bodyLength"], len(self.engine.requests[0].body))
        doc = await self.postJSON("/api/pull", {"name": "m1"})
        self.assertEqual(doc["path"], "/api/pull")
        self.assertEqual(doc["engine"], "fake-openai")

    async def test_hangAfterHeaders(self) -> None:
        """HangAfterHeaders gives 200 headers and no body until closed."""
        self.engine.script(HangAfterHeaders())
        response = await self.post("/v1/chat/completions", dict(CHAT, stream=True))
        self.assertEqual(response.code, 200)
        body = treq.content(response)
        await sleep(0.1)
        self.assertNoResult(body)
        await self.engine.close()
        with self.assertRaises(ResponseFailed):
            await body

    async def test_slowFirstByte(self) -> None:
        """SlowFirstByte sends the headers at once and the body after the delay."""
        self.engine.script(SlowFirstByte(0.3))
        start = reactor.seconds()
        response = await self.post("/v1/chat/completions", CHAT)
        self.assertLess(reactor.seconds() - start, 0.25)
        doc = json.loads(await treq.content(response))
        self.assertGreaterEqual(reactor.seconds() - start, 0.3)
        self.assertEqual(doc["choices"][0]["message"]["content"], "tok0tok1tok2")

    async def test_hang(self) -> None:
        """Hang never answers; cancelling the client closes the engine's connection."""
        self.engine.script(Hang())
        d = self.post("/v1/chat/completions", CHAT)
        pending = Deferred.fromCoroutine(d)
        rec = await self.engine.waitForRequest(1)
        await sleep(0.05)
        self.assertNoResult(pending)
        self.assertNoResult(rec.connectionLost)
        self.assertEqual(self.engine.openConnections, 1)
        pending.cancel()
        self.failureResultOf(pending, ResponseNeverReceived).value.reasons[0].trap(CancelledError)
        await rec.connectionLost
        self.assertEqual(self.engine.openConnections, 0)

    async def test_dieMidStream(self) -> None:
        """DieMidStream sends the first chunks and aborts the connection."""
        self.engine.script(DieMidStream(afterChunks=1))
        response = await self.post("/v1/chat/completions", dict(CHAT, stream=True))
        received: list[bytes] = []
        with self.assertRaises(ResponseFailed):
            await treq.collect(response, received.append)
        data = b"".join(received)
        self.assertIn(b"tok0", data)
        self.assertNotIn(b"tok1", data)
        await self.engine.requests[0].connectionLost

    async def test_drop(self) -> None:
        """Drop aborts the connection without any response."""
        self.engine.script(Drop())
        with self.assertRaises(ResponseNeverReceived):
            await self.post("/v1/chat/completions", CHAT)

    async def test_refuseAfterStopListening(self) -> None:
        """A stopped engine refuses connections."""
        await self.engine.stopListening()
        with self.assertRaises(ConnectionRefusedError):
            await self.post("/v1/chat/completions", CHAT)

    async def test_recordedRequest(self) -> None:
        """Requests are recorded with method, path, lowercase headers and body."""
        waiting = self.engine.waitForRequest(2)
        await self.postJSON("/v1/models?a=b", {"model": "m1"})
        self.assertNoResult(waiting)
        headers: dict[bytes | str, bytes | str] = {"Authorization": "Bearer k"}
        await self.http.post(self.engine.url + "/x", data=b"abc", headers=headers)
        rec = await waiting
        self.assertEqual((rec.method, rec.path, rec.body), ("POST", "/x", b"abc"))
        self.assertEqual(rec.headers["authorization"], ["Bearer k"])
        first = self.engine.requests[0]
        self.assertEqual(first.json(), {"model": "m1"})
        await first.connectionLost


class ConnectionTests(EngineTestCase):
    """HTTP/1.1 details: keep-alive, pipelining, chunked request bodies."""

    async def test_pipelinedKeepAlive(self) -> None:
        """Two pipelined requests on one connection get two responses in order."""
        body = json.dumps(CHAT).encode()
        req = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
            len(body),
            body,
        )
        self.engine.script(Status(503, b"A"))
        proto = await self.raw(req + req)
        await self.engine.waitForRequest(2)
        await sleep(0.05)
        self.assertTrue(proto.data.startswith(b"HTTP/1.1 503 "))
        self.assertEqual(proto.data.count(b"HTTP/1.1 "), 2)
        self.assertEqual(self.engine.openConnections, 1)

    async def test_chunkedRequestAndClose(self) -> None:
        """A chunked request body is decoded; Connection: close closes after the answer."""
        req = (
            b"POST /api/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        )
        proto = await self.raw(req)
        await proto.lost
        self.assertEqual(self.engine.requests[0].body, b"abcde")
        self.assertIn(b'"bodyLength":5', proto.data)
