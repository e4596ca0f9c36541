"""The simulated engine as a process on loopback, with treq and the official openai client."""

from __future__ import annotations

import json
from typing import Any

import treq
from treq.client import HTTPClient
from twisted.internet import reactor as _reactor
from twisted.internet.interfaces import IReactorTCP
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase
from twisted.web.client import Agent, HTTPConnectionPool

from tests.simengine.helpers import chat, sentence
from tests.support.kitprocess import spawnKitEngine

reactor: Any = _reactor


class ProcessTests(TestCase):
    """``python -m nvpair.proxy.testing.simengine`` prints its port and serves."""

    async def spawn(self, *args: str) -> str:
        """Start a simulated engine process; its URL, from the ready line."""
        ready = await spawnKitEngine(self, reactor, "nvpair.proxy.testing.simengine", *args)
        self.assertEqual(ready["url"], f"http://127.0.0.1:{ready['port']}")
        return str(ready["url"])

    def setUp(self) -> None:
        pool = HTTPConnectionPool(IReactorTCP(reactor), persistent=False)
        self.http = HTTPClient(Agent(reactor, pool=pool))

    async def call(self, method: str, url: str, doc: object = None) -> tuple[int, Any]:
        """One request; the status and the JSON body."""
        data = None if doc is None else json.dumps(doc).encode()
        response = await self.http.request(method, url, data=data)
        return response.code, json.loads(await treq.content(response))

    async def test_servesCachesAndFails(self) -> None:
        """A repeated system prompt is served from cache; /sim/fail and /sim/heal work live."""
        url = await self.spawn("--slots", "1", "--prefill-ms", "1", "--decode-ms", "1")
        doc = chat(sentence(200), "hello", max_tokens=4)
        status, first = await self.call("POST", url + "/v1/chat/completions", doc)
        self.assertEqual(
            (status, first["usage"]["prompt_tokens_details"]["cached_tokens"]), (200, 0)
        )
        doc2 = chat(sentence(200), "someone else", max_tokens=4)
        _, second = await self.call("POST", url + "/v1/chat/completions", doc2)
        self.assertEqual(second["timings"]["cache_n"], 192)
        _, slots = await self.call("GET", url + "/slots")
        self.assertEqual([s["is_processing"] for s in slots], [False])
        await self.call("POST", url + "/sim/fail", {"status": 503, "delay_ms": 5})
        status, error = await self.call("POST", url + "/v1/chat/completions", doc)
        self.assertEqual((status, error["error"]["code"]), (503, 503))
        await self.call("POST", url + "/sim/heal", {})
        status, _ = await self.call("POST", url + "/v1/chat/completions", doc)
        self.assertEqual(status, 200)
        _, stats = await self.call("GET", url + "/sim/stats")
        self.assertEqual((stats["completed"], stats["failed"]), (3, 1))
        self.assertGreaterEqual(stats["cached_tokens"], 192 * 2)

    async def test_openaiClientStreams(self) -> None:
        """The official openai client reads the stream and its usage."""
        import openai

        url = await self.spawn("--dialect", "lmstudio", "--models", "a", "--decode-ms", "1")

        def run() -> list[Any]:
            with openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client:
                return list(
                    client.chat.completions.create(
                        model="a",
                        messages=[{"role": "user", "content": "hi"}],
                        max_tokens=3,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                )

        chunks = await deferToThread(run)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, "tok0 tok1 tok2")
        self.assertEqual(
            (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens), (3, 3)
        )
