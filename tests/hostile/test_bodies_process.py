"""Large bodies and long model names through the real process (issue 32 items 1 and 5;
spec §5 "Bodies"): a body over the parse limit is scanned, not parsed, so the reactor's
work for it is bounded; its fields are found at either end; a model name over the bound is
refused before it reaches anything that keeps it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import treq
from twisted.internet import reactor
from twisted.trial.unittest import TestCase
from twisted.web.http_headers import Headers
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from nvpair.proxy.routing.admission import MAX_MODEL, PARSE_LIMIT
from tests.support.standaloneharness import StandaloneProxy

REACTOR: Any = reactor
CHAT = "/v1/chat/completions"
ANSWER = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()


class BodyEngine(Resource):
    """An engine that lists ``m1`` and answers every POST with one chat completion,
    remembering the size of each body it read (twisted.web reads a body linearly, where
    the kit's engines buffer by concatenation, too slowly for tens of megabytes)."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        if request.path in (b"/v1/models", b"/models"):
            return json.dumps({"object": "list", "data": [{"id": "m1"}]}).encode()
        request.setResponseCode(404)
        return b'{"error": "not found"}'

    def render_POST(self, request: Request) -> bytes:
        assert request.content is not None
        self.sizes.append(len(request.content.read()))
        request.setHeader(b"content-type", b"application/json")
        return ANSWER


def agentBody(size: int, **fields: Any) -> bytes:
    """A chat body of at least ``size`` bytes made of an agent's tool calls and results
    (many small objects), with ``fields`` after the messages (the Python SDKs' order)."""
    pair = [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]},
        {"role": "tool", "tool_call_id": "c", "content": "a.py\nb.py\nREADME\n" * 3},
    ]
    count = size // len(json.dumps(pair)) + 1
    return json.dumps({"messages": pair * count, **fields}).encode()


def backendUp(url: str) -> Callable[[dict[str, Any]], bool]:
    """Whether a log record says the proxy saw ``url`` up."""
    return lambda r: r.get("event") == "backend-up" and r.get("url") == url


def cpuSeconds(pid: int) -> float:
    """A process's user and system CPU time."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class LargeBodyTests(TestCase):
    """The standalone process over two engines (so prompt digests would be taken)."""

    timeout = 180

    async def start(self) -> None:
        self.engines = [BodyEngine(), BodyEngine()]
        urls = []
        for engine in self.engines:
            port: Any = REACTOR.listenTCP(0, Site(engine), interface="127.0.0.1")
            self.addCleanup(port.stopListening)
            urls.append(f"http://127.0.0.1:{port.getHost().port}")
        self.proxy = StandaloneProxy(
            self, REACTOR, ["llamacpp"], [("llamacpp", url) for url in urls]
        )
        await self.proxy.start()
        for url in urls:
            await self.proxy.waitForLog(backendUp(url))

    async def post(self, body: bytes) -> tuple[int, bytes]:
        response = await treq.post(
            self.proxy.url("llamacpp") + CHAT,
            data=body,
            headers=Headers({b"content-type": [b"application/json"]}),
            persistent=False,
        )
        return response.code, await treq.content(response)

    def pid(self) -> int:
        assert self.proxy.proto is not None and self.proxy.proto.transport is not None
        return int(self.proxy.proto.transport.pid)

    async def test_largeBodyBoundedWork(self) -> None:
        """A 40 MiB agent body whose model comes after its messages is routed and reaches
        the engine whole, for well under 0.6 s of the proxy's CPU (measured 0.18 s; parsing
        it whole, as the proxy did before, took 0.9 to 1.3 s)."""
        await self.start()
        body = agentBody(40 << 20, model="m1", stream=False, user="big")
        self.assertGreater(len(body), PARSE_LIMIT)
        before = cpuSeconds(self.pid())
        status, answer = await self.post(body)
        spent = cpuSeconds(self.pid()) - before
        self.assertEqual((status, json.loads(answer)["id"]), (200, "chatcmpl-1"))
        self.assertEqual(sum(e.sizes.count(len(body)) for e in self.engines), 1)
        self.assertLess(spent, 0.6, "the proxy's CPU for one 40 MiB body")

    async def test_modelOutOfReach(self) -> None:
        """A large body whose model lies only in its middle is refused 400 ``bad_request``
        without reaching an engine, saying where a large body is read."""
        await self.start()
        filler = "x" * (PARSE_LIMIT // 2)
        body = json.dumps({"a": filler, "model": "m1", "b": filler}).encode()
        status, answer = await self.post(body)
        self.assertEqual(status, 400)
        error = json.loads(answer)["error"]
        self.assertEqual(error["code"], "bad_request")
        self.assertIn("first and last", error["message"])
        self.assertEqual([e.sizes for e in self.engines], [[], []])

    async def test_overlongModel(self) -> None:
        """A model name over the bound is refused 400 at admission, never echoed, and
        leaves no workload behind (the page and ``/status`` never hold it)."""
        await self.start()
        name = "m" * (MAX_MODEL + 1) + "-canary"
        status, answer = await self.post(json.dumps({"model": name, "messages": []}).encode())
        self.assertEqual(status, 400)
        self.assertEqual(json.loads(answer)["error"]["code"], "bad_request")
        self.assertNotIn(b"canary", answer)
        self.assertEqual([e.sizes for e in self.engines], [[], []])
        status, answer = await self.post(json.dumps({"model": "m1", "messages": []}).encode())
        self.assertEqual(status, 200)
